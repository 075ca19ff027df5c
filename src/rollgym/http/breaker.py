"""Circuit breaker per called server: per replica, for a server with several (each replica's
circuit opens and closes on its own).

Closed: requests flow. After ``consecutive_failures`` final failures in a row, or a failure
rate of at least ``failure_rate`` over ``window`` seconds (with ``min_requests``), it opens:
requests fail at once as ``circuit_open`` without being sent. After ``cooldown`` one probe is let
through (half-open); its success closes the breaker, its failure opens it again.
Only server-side failures count (5xx, transport); a 4xx is the caller's problem. A watcher that
knows the server is down (a proxy's liveness heartbeat: ``rollgym.models.liveness``) opens it
at once with ``trip``; ``reason`` says why it last opened, and ``cause`` which failure did (an
error, when known), for the errors of refused calls.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from rollgym.config import BreakerConfig
from rollgym.errors import RollgymError

log = logging.getLogger("rollgym.http.breaker")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
READY, PROBE, SHUT = "ready", "probe", "shut"
"""What ``admits`` answers: calls flow; the next call would be the probe; none would go."""
_BUCKET = 1.0  # seconds per bucket of the failure-rate window


class CircuitBreaker:
    def __init__(
        self, name: str, config: BreakerConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self.state = CLOSED
        self._consecutive = 0
        # The window as per-second buckets [start, requests, failures] with running totals:
        # record() is O(1) however many requests the window holds.
        self._buckets: deque[list[float]] = deque()
        self._requests = 0.0
        self._failures = 0.0
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0
        self.rejected = 0
        self.reason: str | None = None
        """Why the circuit last opened (``None`` before it ever did)."""
        self.cause: RollgymError | None = None
        """The failure that last opened it, when known: the origin of the ``circuit_open``
        errors of calls it refuses before they failed themselves (``rollgym.errors.root_cause``
        counts them by it)."""
        self._last_failure: RollgymError | None = None

    def _now(self) -> float:
        return self._clock()

    def admits(self) -> str:
        """Whether a call sent now would be let through, without letting it (``allow`` does):
        ``READY`` (closed, or disabled), ``PROBE`` (open past its cooldown, or half-open with
        no probe in flight: the next call is the probe), else ``SHUT``. The choice among
        replicas (``rollgym.http.replicas.ReplicaSet``) asks each replica's breaker this, and
        never re-derives the cooldown from the breaker's fields."""
        if not self.config.enabled or self.state == CLOSED:
            return READY
        if self.state == OPEN:
            cooled = self._now() - self._opened_at >= self.config.cooldown
            return PROBE if cooled else SHUT
        return SHUT if self._probing else PROBE

    def allow(self) -> bool:
        """Whether a request may be sent now."""
        if not self.config.enabled or self.state == CLOSED:
            return True
        if self.state == OPEN and self._now() - self._opened_at >= self.config.cooldown:
            self.state = HALF_OPEN
            self._probing = False
            log.info("circuit for %s half-open: probing", self.name)
        if self.state == HALF_OPEN and not self._probing:
            self._probing = True
            return True
        self.rejected += 1
        return False

    def release(self) -> None:
        """The half-open probe ended without an answer (it was cancelled): let another probe
        through instead of staying half-open with a probe that will never report."""
        if self.state == HALF_OPEN:
            self._probing = False

    def trip(self, why: str, cause: RollgymError | None = None) -> None:
        """Open the circuit now, whatever its state (the server is known to be down: ``why``,
        and as an error ``cause``); the cooldown starts again, and a half-open probe in flight
        no longer decides."""
        if not self.config.enabled:
            return
        self._probing = False
        self._open(self._now(), why, cause)

    def record(self, ok: bool, error: RollgymError | None = None) -> None:
        """Report the outcome of one request that was sent: ``ok`` unless the server failed
        (``error``: how, the cause it names if this failure opens the circuit)."""
        if not self.config.enabled:
            return
        now = self._now()
        if not ok:
            self._last_failure = error
        if self.state == HALF_OPEN:
            self._probing = False
            if ok:
                self._close()
            else:
                self._open(now, "probe failed", error)
            return
        self._count(now, ok)
        self._consecutive = 0 if ok else self._consecutive + 1
        if self.state != CLOSED:
            return
        if self._consecutive >= self.config.consecutive_failures:
            self._open(now, f"{self._consecutive} failures in a row", self._last_failure)
            return
        n = self._requests
        if n >= self.config.min_requests and self._failures / n >= self.config.failure_rate:
            why = f"{self._failures:.0f}/{n:.0f} requests failed in {self.config.window:g}s"
            self._open(now, why, self._last_failure)

    def _count(self, now: float, ok: bool) -> None:
        start = now - now % _BUCKET
        horizon = now - self.config.window
        while self._buckets and self._buckets[0][0] + _BUCKET <= horizon:
            _, requests, failures = self._buckets.popleft()
            self._requests -= requests
            self._failures -= failures
        if not self._buckets or self._buckets[-1][0] != start:
            self._buckets.append([start, 0.0, 0.0])
        bucket = self._buckets[-1]
        bucket[1] += 1
        self._requests += 1
        if not ok:
            bucket[2] += 1
            self._failures += 1

    def _open(self, now: float, why: str, cause: RollgymError | None) -> None:
        self.state = OPEN
        self._opened_at = now
        self.opened += 1
        self.reason = why
        # Its body stays with the call that failed; the calls refused need only what it was.
        self.cause = None if cause is None else cause.with_fields(body=None)
        log.warning(
            "circuit for %s opened (%s); cooling down %gs", self.name, why, self.config.cooldown
        )

    def _close(self) -> None:
        self.state = CLOSED
        self._consecutive = 0
        self._buckets.clear()
        self._requests = self._failures = 0.0
        log.info("circuit for %s closed", self.name)
