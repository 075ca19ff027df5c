"""The symbolic check itself, kept apart from the server so a pool worker imports only this.

math-verify bounds its own parsing and comparison with ``signal.alarm``, which works only in a
process's main thread. ``MathEnv`` runs ``check_answer`` in a spawn process pool, where the
function runs in the worker's main thread, so those inner timeouts stay on; the pool's timeout
is the backstop for work a signal cannot interrupt.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

PARSE_TIMEOUT_S = 5
COMPARE_TIMEOUT_S = 5
FLOAT_ROUNDING = 6
"""Decimal places numbers are compared at (math-verify's ``math_metric`` default)."""


@cache
def _math_verify() -> tuple[Any, Any, tuple[Any, ...], tuple[Any, ...]]:
    """math-verify's ``parse``, ``verify`` and the extraction targets. Imported on the first
    check, in the pool worker that runs it: math-verify brings sympy (0.4 s), which the
    server's own process never needs, and which would delay its start by as much."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # What NeMo Gym 0.4.0's math_with_judge extracts: the gold from LaTeX only (it is boxed
    # first), the reply's answer from plain expressions and LaTeX.
    gold = (LatexExtractionConfig(),)
    answer = (ExprExtractionConfig(), LatexExtractionConfig())
    return parse, verify, gold, answer


@dataclass(frozen=True)
class MathCheck:
    """The outcome of one check; plain data, so it crosses the process boundary."""

    gold_parsed: bool
    answer_parsed: bool
    correct: bool


def gold_text(expected: str) -> str:
    """``expected`` as math-verify's gold, as NeMo Gym writes it: outer ``\\(...\\)`` and then
    ``$...$`` removed, the rest boxed (bare ``\\sqrt{18}`` would not parse; boxed it does)."""
    expected = expected.strip()
    if expected.startswith("\\(") and expected.endswith("\\)"):
        expected = expected[2:-2].strip()
    if len(expected) > 1 and expected.startswith("$") and expected.endswith("$"):
        expected = expected[1:-1].strip()
    return f"\\boxed{{{expected}}}"


def check_answer(expected: str, answer: str) -> MathCheck:
    """Whether an answer extracted from ``answer`` equals ``expected``: math-verify's
    ``math_metric`` as NeMo Gym configures it, gold first (the comparison is not symmetric)."""
    parse, verify, gold_targets, answer_targets = _math_verify()
    gold = parse(gold_text(expected), gold_targets, parsing_timeout=PARSE_TIMEOUT_S)
    if not gold:
        return MathCheck(gold_parsed=False, answer_parsed=False, correct=False)
    try:
        predicted = parse(answer, answer_targets, parsing_timeout=PARSE_TIMEOUT_S)
        correct = bool(predicted) and bool(
            verify(
                gold, predicted, float_rounding=FLOAT_ROUNDING, timeout_seconds=COMPARE_TIMEOUT_S
            )
        )
    except Exception:
        # An answer that makes math-verify raise is wrong (the gold
        # parsed, so the fault is in the answer).
        return MathCheck(gold_parsed=True, answer_parsed=False, correct=False)
    return MathCheck(gold_parsed=True, answer_parsed=bool(predicted), correct=correct)
