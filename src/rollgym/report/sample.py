"""Bounded accumulators of a report: a run of any size is read in the same memory.

``Sample`` keeps the count, sum and range of a stream of numbers exactly and at most ``SAMPLE``
of the numbers themselves (a uniform sample past that: reservoir sampling, seeded, so the same
run gives the same page); a plot drawn from a sample says so. ``count_capped`` counts a key
the run's records name (a server, an error type) among at most ``KEYS`` distinct ones.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import Counter

SAMPLE = 20_000
"""Numbers kept per distribution a plot draws (rewards, one hop's seconds, end times)."""
KEYS = 200
"""Distinct keys counted per table (failures by server, by type...); the rest are "other"."""
OTHER = "(other)"


class Sample:
    """A stream of numbers: count, sum, min and max exact; at most ``size`` values kept."""

    def __init__(self, size: int = SAMPLE, seed: int = 0) -> None:
        self.size = size
        self.values = array("d")
        self.count = 0
        self.total = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self._rng = random.Random(seed)
        self._w = 1.0
        self._next = size  # the count at which the next value is kept (Algorithm L)

    def add(self, value: float) -> None:
        """Count ``value`` (a finite number: callers drop the others)."""
        self.count += 1
        self.total += value
        if value < self.lo:
            self.lo = value
        if value > self.hi:
            self.hi = value
        if self.count <= self.size:
            self.values.append(value)
            if self.count == self.size:
                self._skip()
        elif self.count == self._next:
            self.values[self._rng.randrange(self.size)] = value
            self._skip()

    def _skip(self) -> None:
        # Algorithm L (Li, 1994): how many values to pass over before the next one kept, so a
        # value past the sample costs a comparison rather than a random number.
        rng = self._rng
        self._w *= math.exp(math.log(1.0 - rng.random()) / self.size)
        gap = math.log(1.0 - rng.random()) / math.log1p(-self._w) if self._w < 1.0 else 0.0
        self._next = self.count + int(gap) + 1

    def extend(self, values: list[float]) -> None:
        for value in values:
            self.add(value)

    def __len__(self) -> int:
        return self.count

    @property
    def sampled(self) -> bool:
        """Whether ``values`` is a sample (some numbers were not kept)."""
        return self.count > len(self.values)

    @property
    def weight(self) -> float:
        """How many numbers of the stream one kept value stands for."""
        return self.count / len(self.values) if self.values else 0.0

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


def finite(value: object) -> float | None:
    """``value`` as a float if it is a finite number (a record's field is hostile input)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        return None
    return number if math.isfinite(number) else None


def count_capped(counter: Counter[str], key: str, n: int = 1, cap: int = KEYS) -> None:
    """Add ``n`` to ``key``, or to ``OTHER`` once ``cap`` distinct keys are counted."""
    if key not in counter and len(counter) >= cap:
        key = OTHER
    counter[key] += n
