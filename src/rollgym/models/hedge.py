"""When a whole-answer call has run far longer than its replica's recent calls of its size.

A live upstream may lose a call (NeMo Gym's "hang 0.5%": the request is taken and never
answered, while the server and its engine go on serving others): nothing is wrong with the
replica, so neither its liveness probe nor its progress catches it, and the call would wait for
its attempt timeout (600 s). ``LivenessTransport`` instead sends the same request again (a
*hedge*) once the call has run ``HEDGE_FACTOR`` times the 95th percentile of the replica's recent
answers of that size (``Latencies``), and never sooner than ``HEDGE_MIN_S``; the first answer
wins and the other request is cancelled (its connection closed: vLLM aborts a request whose
client went away). The original is never cut for being slow: a long generation that is
progressing still answers, hedged or not.

"That size" is the call's bucket (``size_bucket``): its ``max_tokens`` and its prompt's length,
each rounded to a power of two; a bucket with fewer than ``MIN_SAMPLES`` answers borrows the
replica's answers of every size. Hedges cost the upstream a second generation, so they are
bounded (``HedgeBudget``): at most ``HEDGE_SHARE`` of the calls of the last
``BUDGET_WINDOW_S`` seconds, counted per proxy, or one hedge in flight per replica, whichever
allows more. (The share alone would need 20 calls a minute for one hedge: a run at concurrency
4 with 30 s calls makes 8, and could never hedge the call it lost.)
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any

HEDGE_FACTOR = 4.0
"""A call is hedged after this many times the 95th percentile of its size's recent answers."""
HEDGE_MIN_S = 10.0
"""... and never before this many seconds."""
HEDGE_SHARE = 0.05
"""At most this share of recent calls is hedged."""
BUDGET_WINDOW_S = 60.0
"""Seconds over which calls and hedges are counted for ``HEDGE_SHARE``."""
MIN_SAMPLES = 20
"""Answers a bucket needs before its latencies decide (else: the replica's of every size)."""
WINDOW = 200
"""Recent answers kept per bucket (and per replica)."""

Size = tuple[int, int]
"""A call's bucket: (log2 of ``max_tokens`` rounded up, -1 without one; log2 of its prompt's
length in characters)."""


def _log2(value: float) -> int:
    return 0 if value <= 1 else math.ceil(math.log2(value))


def size_bucket(payload: Mapping[str, Any]) -> Size:
    """The bucket of a chat completion request ``payload``."""
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    tokens = _log2(limit) if isinstance(limit, int) and not isinstance(limit, bool) else -1
    chars = 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            chars += len(content) if isinstance(content, str) else len(str(content or ""))
    return tokens, _log2(chars)


class Latencies:
    """Recent answer times per (replica, size), and when a call of a size is to be hedged."""

    def __init__(
        self,
        *,
        factor: float = HEDGE_FACTOR,
        min_seconds: float = HEDGE_MIN_S,
        min_samples: int = MIN_SAMPLES,
        window: int = WINDOW,
    ) -> None:
        self.factor, self.min_seconds = factor, min_seconds
        self.min_samples, self.window = min_samples, window
        self._seen: dict[Hashable, deque[float]] = {}

    def add(self, replica: str, size: Size | None, seconds: float) -> None:
        """One answer of replica ``replica`` to a call of ``size`` after ``seconds``."""
        for key in ((replica, size), replica):
            seen = self._seen.get(key)
            if seen is None:
                seen = self._seen[key] = deque(maxlen=self.window)
            seen.append(seconds)

    def hedge_after(self, replica: str, size: Size | None) -> float | None:
        """Seconds after which a call of ``size`` to ``replica`` is hedged (``None``: too few
        answers seen to say)."""
        seen = self._seen.get((replica, size))
        if seen is None or len(seen) < self.min_samples:
            seen = self._seen.get(replica)
            if seen is None or len(seen) < self.min_samples:
                return None
        ordered = sorted(seen)
        p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
        return max(self.min_seconds, self.factor * p95)


class HedgeBudget:
    """At most ``share`` of the calls of the last ``window`` seconds may be hedged, or, beyond
    that, one hedge in flight per replica (``try_hedge(replica)``; ``finished(replica)`` when
    it ends)."""

    def __init__(
        self,
        share: float = HEDGE_SHARE,
        window: float = BUDGET_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.share, self.window, self._clock = share, window, clock
        # Per-second buckets [second, calls, hedges]: O(1) per call however many there are.
        self._buckets: deque[list[float]] = deque()
        self._calls = self._hedges = 0.0
        self._in_flight: dict[str, int] = {}
        self.hedged = 0
        """Hedges granted in all."""

    def _bucket(self) -> list[float]:
        now = self._clock()
        second = math.floor(now)
        while self._buckets and self._buckets[0][0] <= now - self.window:
            _, calls, hedges = self._buckets.popleft()
            self._calls -= calls
            self._hedges -= hedges
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0.0, 0.0])
        return self._buckets[-1]

    def note_call(self) -> None:
        self._bucket()[1] += 1
        self._calls += 1

    def try_hedge(self, replica: str | None = None) -> bool:
        """Whether one more hedge (to ``replica``) is within the share, or is the replica's
        only one in flight; counted if so (then call ``finished(replica)`` when it ends)."""
        bucket = self._bucket()
        alone = replica is not None and not self._in_flight.get(replica)
        if self._hedges + 1 > self.share * self._calls and not alone:
            return False
        bucket[2] += 1
        self._hedges += 1
        self.hedged += 1
        if replica is not None:
            self._in_flight[replica] = self._in_flight.get(replica, 0) + 1
        return True

    def finished(self, replica: str) -> None:
        """A hedge granted for ``replica`` ended (answered, failed or cancelled)."""
        left = self._in_flight.get(replica, 0) - 1
        if left > 0:
            self._in_flight[replica] = left
        else:
            self._in_flight.pop(replica, None)
