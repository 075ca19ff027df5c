"""Retry budget per called server, in the spirit of gRPC retry throttling and Envoy's budget.

Retries may be at most ``ratio`` of the requests sent in the last ``window`` seconds, plus a small
floor so a quiet server can still be retried. Past it, a transient failure fails at once: when a
server is failing for everyone, retrying multiplies its load instead of rescuing requests.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from rollgym.config import RetryBudgetConfig

_BUCKET = 1.0  # seconds per bucket; the window is a ring of buckets


class RetryBudget:
    """Counts first attempts (requests) and retries per one-second bucket over ``window``."""

    def __init__(
        self, config: RetryBudgetConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        self._buckets: deque[list[float]] = deque()  # [bucket_start, requests, retries]
        self.refused = 0

    def _now_bucket(self) -> list[float]:
        now = self._clock()
        start = now - now % _BUCKET
        horizon = now - self.config.window
        while self._buckets and self._buckets[0][0] + _BUCKET <= horizon:
            self._buckets.popleft()
        if not self._buckets or self._buckets[-1][0] != start:
            self._buckets.append([start, 0.0, 0.0])
        return self._buckets[-1]

    def record_request(self) -> None:
        """Count one call (its first attempt). Retries are not requests here: counting them
        would let every retry raise the budget for the next one."""
        self._now_bucket()[1] += 1

    def try_retry(self) -> bool:
        """Spend one retry if the budget allows it; False means fail now."""
        if not self.config.enabled:
            return True
        bucket = self._now_bucket()
        requests = sum(b[1] for b in self._buckets)
        retries = sum(b[2] for b in self._buckets)
        if retries + 1 > self.config.ratio * requests + self.config.min_retries_per_window:
            self.refused += 1
            return False
        bucket[2] += 1
        return True
