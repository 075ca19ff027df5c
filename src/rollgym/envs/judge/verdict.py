"""Reading a judge's verdict: equivalence labels (NeMo Gym's ``[[A=B]]`` / ``[[A!=B]]``) or
rubric scores (``[[criterion: N]]``). A verdict that cannot be read is ``UnparseableVerdict``,
a failure of the rollout, never a score of 0 (NeMo Gym scores it 0)."""

from __future__ import annotations

import re
from dataclasses import dataclass

EQUAL_LABEL = "[[A=B]]"
NOT_EQUAL_LABEL = "[[A!=B]]"
_SCORE = re.compile(r"\[\[\s*([A-Za-z0-9_ .-]+?)\s*:\s*(-?\d+(?:\.\d+)?)\s*\]\]")


@dataclass(frozen=True)
class Criterion:
    name: str
    description: str
    weight: float = 1.0


def equivalence(text: str, equal: str = EQUAL_LABEL, not_equal: str = NOT_EQUAL_LABEL) -> bool:
    """Whether the judge said equal: the first label in the text wins (NeMo Gym's rule);
    ``ValueError`` if neither label is there."""
    at_equal, at_not = text.find(equal), text.find(not_equal)
    if at_equal < 0 and at_not < 0:
        raise ValueError(f"no verdict label ({equal} or {not_equal}) in the judge's answer")
    return at_equal >= 0 and (at_not < 0 or at_equal < at_not)


def rubric_scores(text: str, criteria: list[Criterion], max_score: float) -> dict[str, float]:
    """Each criterion's score in [0, 1] from ``[[name: N]]`` (N from 0 to ``max_score``; the
    last one given counts); ``ValueError`` if one is missing or out of range."""
    given: dict[str, float] = {}
    for name, value in _SCORE.findall(text):
        given[name.strip().lower()] = float(value)
    scores: dict[str, float] = {}
    for c in criteria:
        value = given.get(c.name.lower())
        if value is None:
            raise ValueError(f"no score for criterion {c.name!r} ([[{c.name}: N]])")
        if not 0 <= value <= max_score:
            raise ValueError(f"criterion {c.name!r}: score {value:g} outside 0..{max_score:g}")
        scores[c.name] = value / max_score
    return scores
