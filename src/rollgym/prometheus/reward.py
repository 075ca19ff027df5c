"""Rewards per environment, as a histogram cheap enough for every recorded rollout.

Kept as ``latency.py`` keeps seconds (a ``bisect`` and two additions, no lock; no
``prometheus_client`` here, an extra the collector may lack) and read only at a scrape
(``rollgym.collect.metrics_port``). The environment is a server name of the run's config,
handed in by the collector; at most ``MAX_NAMES`` are kept (the rest are ``other``), so the
label set stays bounded whatever a run's rows say.
"""

from __future__ import annotations

import math
from bisect import bisect_left

from rollgym.prometheus.latency import MAX_NAMES, OTHER

REWARD_BUCKETS: tuple[float, ...] = (
    0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (``le``) of the buckets: a reward of exactly 0 or 1 (most verifiers' two
answers) lands in a bucket of its own bound, so ``le="0.0"`` counts the zeros (and any negative
reward). No bucket below 0: the exposition then drops ``_count`` and ``_sum``, and the mean
reward (``_sum`` over ``_count``) is what a dashboard wants most."""


class Rewards:
    """Counts of rewards per bucket (not cumulative), their sum, per environment."""

    __slots__ = ("by_environment",)

    def __init__(self) -> None:
        self.by_environment: dict[str, tuple[list[int], list[float]]] = {}

    def observe(self, environment: str, reward: float) -> None:
        """Count ``reward`` (a reward that is no finite number is no measurement: left out)."""
        if not math.isfinite(reward):
            return
        entry = self.by_environment.get(environment)
        if entry is None:
            if len(self.by_environment) >= MAX_NAMES - 1:
                environment = OTHER
            entry = self.by_environment.setdefault(
                environment, ([0] * (len(REWARD_BUCKETS) + 1), [0.0])
            )
        entry[0][bisect_left(REWARD_BUCKETS, reward)] += 1
        entry[1][0] += reward

    def cumulative(self) -> dict[str, tuple[list[tuple[str, int]], float]]:
        """Per environment: ``(le, count)`` pairs as the exposition format wants them
        (``+Inf`` last), and the sum."""
        bounds = (*(repr(float(b)) for b in REWARD_BUCKETS), "+Inf")
        out = {}
        for environment, (counts, total) in sorted(self.by_environment.items()):
            running, buckets = 0, []
            for bound, n in zip(bounds, counts, strict=True):
                running += n
                buckets.append((bound, running))
            out[environment] = (buckets, total[0])
        return out
