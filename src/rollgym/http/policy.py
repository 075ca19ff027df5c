"""The retry policy of a called server: its models (``RetryPolicy`` and the budget, breaker and
answer limits it carries, read from each server's ``retry:`` in the config) and its rules, which
failure may be tried again and how long to back off.

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

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollgym.errors import (
    ConnectError,
    ConnectionLost,
    HTTPStatusError,
    ProtocolError,
    ReadTimeout,
    RollgymError,
)

MAX_ATTEMPTS_CAP = 10
_MIB = 1 << 20
_KIB = 1 << 10


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EndpointPolicy(_Strict):
    """Overrides of a server's retry policy for one endpoint (e.g. ``/verify``)."""

    idempotent: bool | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS_CAP)
    attempt_timeout: float | None = Field(default=None, gt=0)


class RetryBudgetConfig(_Strict):
    """Retries may not exceed ``ratio`` of recent requests plus ``min_retries_per_window``."""

    enabled: bool = True
    ratio: float = Field(default=0.2, ge=0, le=10)
    min_retries_per_window: int = Field(default=10, ge=0)
    window: float = Field(default=10.0, gt=0)


class BreakerConfig(_Strict):
    """Open after ``consecutive_failures`` final failures in a row, or a failure rate of at
    least ``failure_rate`` over ``window`` seconds with ``min_requests``; probe after ``cooldown``."""

    enabled: bool = True
    consecutive_failures: int = Field(default=50, ge=1)
    failure_rate: float = Field(default=0.9, gt=0, le=1)
    min_requests: int = Field(default=50, ge=1)
    window: float = Field(default=30.0, gt=0)
    cooldown: float = Field(default=5.0, gt=0)


class AnswerLimits(_Strict):
    """The most a caller reads of one answer of this server (``retry.answer_limits``). Past
    any of them the call fails with ``AnswerTooLarge`` and nothing more is read: a hostile or
    broken server (a gzip bomb, a body that never ends) costs its caller at most this much."""

    body_bytes: int = Field(default=64 * _MIB, ge=1, description="body as sent (compressed)")
    decompressed_bytes: int = Field(default=64 * _MIB, ge=1, description="body once decoded")
    header_bytes: int = Field(default=64 * _KIB, ge=1, description="all header lines together")
    headers: int = Field(default=100, ge=1, description="header lines")


class RetryPolicy(_Strict):
    """How calls to one server are made and retried. Attempts, total time and the size of an
    answer (``answer_limits``) are always bounded."""

    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS_CAP)
    backoff_initial: float = Field(default=0.1, ge=0)
    backoff_multiplier: float = Field(default=2.0, ge=1)
    backoff_max: float = Field(default=5.0, ge=0)
    deadline: float = Field(default=900.0, gt=0, description="total seconds across attempts")
    connect_timeout: float = Field(default=5.0, gt=0)
    attempt_timeout: float = Field(default=600.0, gt=0)
    idempotent: bool = False
    retry_statuses: tuple[int, ...] = (502, 503, 504)
    retry_4xx: tuple[int, ...] = ()
    retry_after_cap: float = Field(default=30.0, ge=0)
    endpoints: dict[str, EndpointPolicy] = Field(default_factory=dict)
    budget: RetryBudgetConfig = RetryBudgetConfig()
    breaker: BreakerConfig = BreakerConfig()
    # Here, not under ``limits:``: like the timeouts, they bound what callers of this server
    # accept, and travel with its policy to every caller (a proxy's ``upstream_retry`` too).
    answer_limits: AnswerLimits = AnswerLimits()

    @field_validator("retry_statuses")
    @classmethod
    def _only_5xx(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in value if not 500 <= s <= 599]
        if bad:
            raise ValueError(f"only 5xx statuses belong here, not {bad} (408/429: use retry_4xx)")
        return value

    @field_validator("retry_4xx")
    @classmethod
    def _only_408_429(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in value if s not in (408, 429)]
        if bad:
            raise ValueError(f"only 408 and 429 may be retried among 4xx, not {bad}")
        return value

    @field_validator("endpoints")
    @classmethod
    def _slash(cls, value: dict[str, EndpointPolicy]) -> dict[str, EndpointPolicy]:
        for name in value:
            if not name.startswith("/"):
                raise ValueError(f"endpoint {name!r} must start with '/'")
        return value

    def for_endpoint(self, endpoint: str) -> tuple[bool, int, float]:
        """(idempotent, max_attempts, attempt_timeout) in force for ``endpoint``."""
        override = self.endpoints.get(endpoint)
        if override is None:
            return self.idempotent, self.max_attempts, self.attempt_timeout
        return (
            self.idempotent if override.idempotent is None else override.idempotent,
            self.max_attempts if override.max_attempts is None else override.max_attempts,
            self.attempt_timeout if override.attempt_timeout is None else override.attempt_timeout,
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
