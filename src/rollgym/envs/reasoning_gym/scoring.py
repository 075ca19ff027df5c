"""The score itself, run in a pool worker: the dataset's own ``score_answer`` on the restored
entry. Kept apart from the server so a worker imports only this (and reasoning-gym, which the
server's own process never needs).

reasoning-gym is imported, and ``guard.install`` run, when a worker imports this module. A
dataset's scorer is built once per worker for each (dataset, config): some read data files
when built (codeio, arc_agi). Its ``score_answer`` is called on the answer; if that raises,
once more on the entry's reference answer (None when it has none), to say whose fault it was:
an entry whose reference makes the scorer raise too is broken, an answer that alone does is
an answer the scorer cannot read. A row carried without type patches (no ``reasoning_gym``) of a
dataset whose entries need them is refused (``row_error``): its reference would score wrong.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import reasoning_gym

from rollgym.envs.reasoning_gym import guard
from rollgym.envs.reasoning_gym.carry import NotCarried, carry, restore

# On import: the pool's warm-up (as the server starts) imports this module in each worker, so
# neither reasoning-gym's import (a second or more) nor the guard counts against a deadline.
guard.install()

ERROR_CHARS = 300


@dataclass(frozen=True)
class Scored:
    """One score; plain data, so it crosses the process boundary. ``error`` (``Type: text``)
    when the scorer raised on the answer or gave no number in [0, 1]; ``entry_error`` when it
    raised on the entry's own reference answer too; ``row_error`` when the row cannot be
    scored right at all."""

    score: float | None
    error: str | None = None
    entry_error: str | None = None
    lost: bool = False  # no score because its worker died (set by the server)
    row_error: str | None = None


@lru_cache(maxsize=64)  # rows choose the configs: bounded, whatever a task file holds
def _scorer(dataset: str, config_json: str) -> Any:
    config: dict[str, Any] = json.loads(config_json)
    # size and seed choose which entries a dataset makes; a score reads only its entry.
    return reasoning_gym.create_dataset(dataset, **{"size": 1, "seed": 0, **config})


def score_entry(
    dataset: str,
    config_json: str,
    plain: dict[str, Any],
    patches: list[Any],
    answer: str,
    carried: bool = True,
) -> Scored:
    """``dataset``'s score of ``answer`` for the entry ``plain`` + ``patches`` describe
    (``carried``: by a row of rollgym's, which lists every patch). A scorer that cannot be
    built is the row's problem (``entry_error``), as one that raises on the row's own
    reference."""
    try:
        scorer = _scorer(dataset, config_json)
    except Exception as exc:  # the server checked the config; its __init__ may still refuse
        unbuilt = f"building {dataset}'s scorer: {_describe(exc)}"
        return Scored(score=None, error=unbuilt, entry_error=unbuilt)
    if not carried and _needs_restore(dataset, config_json):
        return Scored(
            score=None,
            row_error=f"{dataset}'s entries hold tuples or int-keyed dicts, which a JSON row "
            "loses; this row (NeMo Gym-shaped, no 'reasoning_gym' field) cannot say where, so "
            "its own reference could score wrong: make rows with `rollgym tasks reasoning-gym`",
        )
    entry = restore(plain, patches)
    try:
        value = scorer.score_answer(answer, entry)
    except Exception as exc:  # the scorer's own code: any exception is its
        error = _describe(exc)
    else:
        problem = _problem(value)
        if problem is None:
            return Scored(score=float(value))
        error = problem
    reference = entry.get("answer")
    try:
        scorer.score_answer(reference if isinstance(reference, str) else None, entry)
    except Exception as exc:
        return Scored(score=None, error=error, entry_error=_describe(exc))
    return Scored(score=None, error=error)


@lru_cache(maxsize=64)
def _needs_restore(dataset: str, config_json: str) -> bool:
    """Whether the dataset's scorer needs the types JSON loses: its first entry's reference
    answer scores otherwise on the entry as JSON carries it (most entries hold tuples, in
    ``metadata.difficulty``, that no scorer reads)."""
    scorer = _scorer(dataset, config_json)
    entry = scorer[0]
    try:
        plain, patches = carry(entry)
    except NotCarried:  # no JSON row holds its entries at all
        return True
    reference = entry.get("answer")
    if not patches or not isinstance(reference, str):
        return False
    try:
        return bool(scorer.score_answer(reference, plain) != scorer.score_answer(reference, entry))
    except Exception:  # raising on the JSON form is scoring it otherwise
        return True


def _problem(value: Any) -> str | None:
    """Why ``value`` is no score (None if it is one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"score_answer returned {type(value).__name__} {value!r:.60}, not a number"
    # Not even 1.0000000000000002 is clamped: spell_backward sums 1/len per matching letter,
    # so the reference followed by junk comes out there, missing the penalty it meant to take.
    if not math.isfinite(float(value)) or not 0.0 <= float(value) <= 1.0:
        return f"score_answer returned {value!r}, outside [0, 1]"
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
