"""A long-tailed, seeded model latency for the scripted model (benchmarks of the long tail).

    latency_dist:
      lognormal: {median_s: 0.05, p99_over_median: 30}   # p99 = 1.5 s
      seed: 0
      cap_over_median: 1000                              # no draw past 50 s

Each call's delay is drawn from a lognormal with that median and 99th percentile, from a hash
of ``(seed, rollout id, turn)``: the same rollout's same turn waits as long in every run and
whatever the order of the calls, and a draw costs one hash and one inverse normal CDF (cheap at
16k concurrent calls: no shared generator, no lock). Calls without a rollout id draw from a
counter. Draws are capped at ``cap_over_median`` times the median (a 64-bit uniform can reach
9 standard deviations: unbounded sleeps would make a benchmark's length a lottery).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from statistics import NormalDist

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

_Z99 = NormalDist().inv_cdf(0.99)
_UNIT = NormalDist()


class Lognormal(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    median_s: float = Field(gt=0, le=3600, description="the median delay, seconds")
    p99_over_median: float = Field(ge=1, le=1e4, description="the 99th percentile / median")


class LatencyDist(BaseModel):
    """A per-call delay distribution (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    lognormal: Lognormal
    seed: int = 0
    cap_over_median: float = Field(default=1000.0, ge=1, le=1e6)
    _anonymous: itertools.count[int] = PrivateAttr(default_factory=itertools.count)

    def draw(self, rollout: str | None, turn: int) -> float:
        """The delay in seconds of ``rollout``'s model call number ``turn``."""
        key = rollout if rollout is not None else f"#{next(self._anonymous)}"
        digest = hashlib.blake2b(f"{self.seed}|{key}|{turn}".encode(), digest_size=8).digest()
        u = (int.from_bytes(digest, "big") + 0.5) / 2**64  # in (0, 1): inv_cdf takes no 0 or 1
        dist = self.lognormal
        sigma = math.log(dist.p99_over_median) / _Z99
        seconds = dist.median_s * math.exp(sigma * _UNIT.inv_cdf(u))
        return min(seconds, dist.median_s * self.cap_over_median)
