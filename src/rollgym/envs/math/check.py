"""The symbolic check itself, kept apart from the server so a pool worker imports only this.

math-verify bounds its own parsing and comparison with ``signal.alarm``, which works only in a
process's main thread. ``MathEnv`` runs ``check_answer`` in a spawn process pool, where the
function runs in the worker's main thread, so those inner timeouts stay on; the pool's timeout
is the backstop for work a signal cannot interrupt.
"""

from __future__ import annotations

from dataclasses import dataclass

from math_verify import parse, verify

PARSE_TIMEOUT_S = 5
COMPARE_TIMEOUT_S = 5


@dataclass(frozen=True)
class MathCheck:
    """The outcome of one check; plain data, so it crosses the process boundary."""

    gold_parsed: bool
    answer_parsed: bool
    correct: bool


def gold_text(expected: str) -> str:
    """``expected`` as math-verify's gold: bare answers are boxed so LaTeX extraction applies
    (bare ``\\sqrt{18}`` would not parse; ``\\boxed{\\sqrt{18}}`` does)."""
    expected = expected.strip()
    if "$" in expected or "\\boxed" in expected:
        return expected
    return f"\\boxed{{{expected}}}"


def check_answer(expected: str, answer: str) -> MathCheck:
    """Whether the final answer in ``answer`` equals ``expected`` (gold first: math-verify's
    comparison is not symmetric)."""
    gold = parse(gold_text(expected), parsing_timeout=PARSE_TIMEOUT_S)
    if not gold:
        return MathCheck(gold_parsed=False, answer_parsed=False, correct=False)
    predicted = parse(answer, parsing_timeout=PARSE_TIMEOUT_S)
    if not predicted:
        return MathCheck(gold_parsed=True, answer_parsed=False, correct=False)
    correct = bool(verify(gold, predicted, timeout_seconds=COMPARE_TIMEOUT_S))
    return MathCheck(gold_parsed=True, answer_parsed=True, correct=correct)
