"""The decision after one failed attempt: try again after how long, or stop with which error.

Pure: no I/O, no clock, no shared state. Everything weighed is passed in, and the only
randomness is the backoff's jitter, drawn from ``rng``. The client does the effects (breaker,
budget, sleeping). The steps, in order:

1. A read timeout of an attempt that had only what was left of the total deadline is that
   deadline running out: ``DeadlineExceeded``, final.
2. Not transient under the policy (``policy.is_transient``), a body that declared itself final,
   or the endpoint's attempts used up: final, with the error's ``retryable`` saying whether a
   caller may run the whole thing again.
3. ``Retry-After`` past the policy's cap: final at once, rather than sleep that long.
4. A delay (backoff, at least ``Retry-After``) that leaves no time within the total deadline:
   ``DeadlineExceeded``, final.
5. Otherwise retry after the delay.

Apart from that, ``blame`` says whether the failure counts against the server's breaker: a 5xx
or no answer does; a 4xx does not (the server answered), nor does a gateway's report of another
server's failure (that server has a breaker of its own).

The errors returned are always new objects (``with_fields`` or a constructor): the attempt's
error is never changed in place.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rollgym.config import RetryPolicy
from rollgym.errors import (
    BudgetExhausted,
    CircuitOpen,
    DeadlineExceeded,
    HTTPStatusError,
    ReadTimeout,
    RollgymError,
    SessionLost,
)
from rollgym.http.policy import backoff, is_transient


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after a failed attempt."""

    error: RollgymError
    """The error to raise if the call stops here (``attempts`` and ``retryable`` final)."""
    retry: bool
    delay: float = 0.0
    """Seconds to wait before the next attempt (when ``retry``)."""
    blame: bool = False
    """Whether the failure counts against the server (its circuit breaker)."""


def classify(
    err: RollgymError,
    policy: RetryPolicy,
    *,
    idempotent: bool,
    max_attempts: int,
    attempt: int,
    time_left: float,
    deadline: float,
    timeout_was_deadline: bool = False,
    retry_after: float | None = None,
    final: bool = False,
    rng: random.Random | None = None,
) -> Decision:
    """Decide about ``err``, the failure of attempt number ``attempt`` (from 1).

    ``time_left``: seconds of the call's total ``deadline`` left now. ``timeout_was_deadline``:
    the attempt's timeout was cut to what was left of the deadline. ``retry_after``: seconds the
    server asked for. ``final``: the server's error body said ``"retryable": false``.
    """
    blame = blames_server(err)
    if isinstance(err, ReadTimeout) and timeout_was_deadline:
        ran_out = DeadlineExceeded(
            f"{err.server}: total deadline of {deadline:g}s ran out",
            server=err.server, endpoint=err.endpoint, method=err.method, url=err.url,
            attempts=attempt, retryable=False, origin=err,
        )  # fmt: skip
        return Decision(ran_out, retry=False, blame=blame)
    # A final body: e.g. a gateway whose own upstream already used its retries; retrying here
    # would multiply the attempts.
    transient = not final and is_transient(err, policy, idempotent)
    err = err.with_fields(attempts=attempt, retryable=transient)
    if not transient or attempt >= max_attempts:
        return Decision(err, retry=False, blame=blame)
    delay = backoff(policy, attempt, rng)
    if retry_after is not None and isinstance(err, HTTPStatusError):
        if retry_after > policy.retry_after_cap:
            return Decision(err, retry=False, blame=blame)
        delay = max(delay, retry_after)
    if delay >= time_left:
        no_time = DeadlineExceeded(
            f"{err.server}: no time left for another attempt within {deadline:g}s",
            server=err.server, endpoint=err.endpoint, method=err.method, url=err.url,
            attempts=attempt, origin=err,
        )  # fmt: skip
        return Decision(no_time, retry=False, blame=blame)
    return Decision(err, retry=True, delay=delay, blame=blame)


def blames_server(err: RollgymError) -> bool:
    """Whether ``err`` counts against the server that was called."""
    if isinstance(err, HTTPStatusError):
        if err.origin is not None and err.origin.server not in (None, err.server):
            # A gateway reporting another server's failure (an agent's 502 for a broken model):
            # the gateway itself is healthy, and the other server has its own breaker.
            return False
        return (err.status or 0) >= 500
    if isinstance(err, ReadTimeout):
        return True  # a read timeout of any kind (a stalled upstream's too)
    return err.type in ("connect_error", "connection_lost", "protocol_error")


# -- the errors of a call stopped before its next attempt ------------------------------------


def circuit_open(
    server: str,
    endpoint: str,
    *,
    attempts: int,
    last: RollgymError | None,
    why: str | None = None,
    cause: RollgymError | None = None,
) -> CircuitOpen:
    """The breaker of ``server`` refused attempt ``attempts + 1`` (``last`` failed before);
    ``why`` is what opened it (``CircuitBreaker.reason``), named in the message, and ``cause``
    the failure that did (``CircuitBreaker.cause``): the origin when this call had no failure
    of its own before, so a refusal is counted by what opened the breaker."""
    return CircuitOpen(
        f"circuit for {server} is open ({why or 'after repeated failures'}); not sent",
        server=server, endpoint=endpoint, method="POST", attempts=attempts or 1,
        origin=last if last is not None else cause,
    )  # fmt: skip


def replica_lost(
    server: str, endpoint: str, url: str, *, attempts: int, last: RollgymError | None
) -> SessionLost:
    """A pinned call's replica is down: its state is gone with it, so no other replica will do."""
    return SessionLost(
        f"{server} replica {url} is down, and this call's session lived there",
        server=server, endpoint=endpoint, method="POST", url=url, attempts=attempts,
        retryable=False, origin=last,
    )  # fmt: skip


def budget_exhausted(err: RollgymError) -> BudgetExhausted:
    """The retry budget of the server refused to retry ``err``. Its body stays with ``err``
    (the origin): a record keeps it once."""
    return BudgetExhausted(
        f"retry budget for {err.server} is spent; not retrying {err.type}",
        server=err.server, endpoint=err.endpoint, method=err.method, url=err.url,
        status=err.status, attempts=err.attempts, origin=err,
    )  # fmt: skip
