"""Circuit breaker per called server.

Closed: requests flow. After ``consecutive_failures`` final failures in a row, or a failure
rate of at least ``failure_rate`` over ``window`` seconds (with ``min_requests``), it opens:
requests fail at once as ``circuit_open`` without being sent. After ``cooldown`` one probe is let
through (half-open); its success closes the breaker, its failure opens it again.
Only server-side failures count (5xx, transport); a 4xx is the caller's problem.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from rollgym.config import BreakerConfig

log = logging.getLogger("rollgym.http.breaker")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(
        self, name: str, config: BreakerConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self.state = CLOSED
        self._consecutive = 0
        self._events: deque[tuple[float, bool]] = deque()
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0
        self.rejected = 0

    def _now(self) -> float:
        return self._clock()

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

    def record(self, ok: bool) -> None:
        """Report the outcome of one request that was sent: ``ok`` unless the server failed."""
        if not self.config.enabled:
            return
        now = self._now()
        if self.state == HALF_OPEN:
            self._probing = False
            if ok:
                self._close()
            else:
                self._open(now, "probe failed")
            return
        self._events.append((now, ok))
        horizon = now - self.config.window
        while self._events and self._events[0][0] < horizon:
            self._events.popleft()
        self._consecutive = 0 if ok else self._consecutive + 1
        if self.state != CLOSED:
            return
        if self._consecutive >= self.config.consecutive_failures:
            self._open(now, f"{self._consecutive} failures in a row")
            return
        n = len(self._events)
        if n >= self.config.min_requests:
            failed = sum(1 for _, good in self._events if not good)
            if failed / n >= self.config.failure_rate:
                self._open(now, f"{failed}/{n} requests failed in {self.config.window:g}s")

    def _open(self, now: float, why: str) -> None:
        self.state = OPEN
        self._opened_at = now
        self.opened += 1
        log.warning(
            "circuit for %s opened (%s); cooling down %gs", self.name, why, self.config.cooldown
        )

    def _close(self) -> None:
        self.state = CLOSED
        self._consecutive = 0
        self._events.clear()
        log.info("circuit for %s closed", self.name)
