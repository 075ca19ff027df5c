"""Latency histograms cheap enough for every call of a rollout.

``prometheus_client``'s ``Histogram.observe`` takes a lock and, with labels, a dict lookup under
another lock: about 1.8 us per observation with a cached child, 4 us through ``labels()``
(``bench/metrics_cost.py`` measures both). A rollout makes several timed calls in each process,
so these counts are kept here instead, without a lock (every rollgym process observes from its
one event loop), at about 0.5 us each; ``prometheus_client`` only reads them when ``/metrics``
is scraped (``rollgym.prometheus.families``).
"""

from __future__ import annotations

from bisect import bisect_left

BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
"""Upper bounds (seconds) of the buckets: from a local hop (under a millisecond) to a long
generation (the agent's default model timeout is 600 s). ``+Inf`` follows."""

MAX_NAMES = 64
"""Distinct names a ``LatencyByName`` keeps; later ones go to ``OTHER``. Names come from code
and configs (hops, servers), but a label set that could grow without bound would be a memory
leak in a process that runs for days."""
OTHER = "other"


class Latency:
    """Counts of observed seconds per bucket (not cumulative), their sum and count."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (``le``).
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as the exposition format wants them, ``+Inf`` last."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*map(_le, BUCKETS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class LatencyByName:
    """A ``Latency`` per name (a hop, a called server), at most ``MAX_NAMES`` of them."""

    __slots__ = ("by_name",)

    def __init__(self) -> None:
        self.by_name: dict[str, Latency] = {}

    def observe(self, name: str, seconds: float) -> None:
        latency = self.by_name.get(name)
        if latency is None:
            latency = self._new(name)
        latency.observe(seconds)

    def _new(self, name: str) -> Latency:
        if len(self.by_name) >= MAX_NAMES - 1 and name != OTHER:
            name = OTHER
        return self.by_name.setdefault(name, Latency())


def _le(bound: float) -> str:
    return repr(float(bound))


class CallLatency:
    """The seconds of a client's calls to one server, from the first attempt to the answer or
    the final error (retries and their waits included), apart for calls that succeeded and
    calls that failed: a timeout's seconds would hide how fast the server answers."""

    __slots__ = ("failed", "ok")

    def __init__(self) -> None:
        self.ok = Latency()
        self.failed = Latency()
