"""The rules of a called server's retry policy: which failure may be tried again and how long to
back off. The policy itself (``RetryPolicy`` and the budget, breaker and answer limits it
carries) is config, read from each server's ``retry:``: ``rollgym.config``.

The rules, per DESIGN.md: nothing sent (connect refused) -> retry; 502/503/504 -> retry; 500, a
reset or a timeout after the request was sent, or a garbled 2xx -> retry only on an idempotent
endpoint; 4xx -> never, except 408/429 when the policy lists them (honouring ``Retry-After`` up
to a cap; past the cap, fail at once rather than sleep). ``rollgym.http.classify`` applies
them to one failed attempt.
"""

from __future__ import annotations

import random
from email.utils import parsedate_to_datetime
from time import time

from rollgym.config import RetryPolicy
from rollgym.errors import (
    ConnectError,
    ConnectionLost,
    HTTPStatusError,
    ProtocolError,
    ReadTimeout,
    RollgymError,
)


def is_transient(err: RollgymError, policy: RetryPolicy, idempotent: bool) -> bool:
    """Whether ``err`` may be retried at all under ``policy`` (ignoring attempts and time)."""
    if isinstance(err, ConnectError):
        return err.retryable
    if isinstance(err, HTTPStatusError):
        status = err.status or 0
        if status in policy.retry_statuses:
            return True
        if status == 500:
            return idempotent
        return status in policy.retry_4xx
    if isinstance(err, (ConnectionLost, ReadTimeout, ProtocolError)):
        return idempotent
    return False


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter before attempt ``attempt + 1``."""
    ceiling = min(
        policy.backoff_max, policy.backoff_initial * policy.backoff_multiplier ** (attempt - 1)
    )
    return (rng or random).uniform(0, ceiling)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time())
    except (TypeError, ValueError, IndexError):
        return None
