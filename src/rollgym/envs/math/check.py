"""The symbolic check itself, kept apart from the server so a pool worker imports only this.

math-verify bounds its own parsing and comparison with ``signal.alarm``, which works only in a
process's main thread. ``MathEnv`` runs ``check_answer`` in a spawn process pool, where the
function runs in the worker's main thread, so those inner timeouts stay on; the pool's timeout
is the backstop for work a signal cannot interrupt.

An answer that only restates the problem earns nothing. math-verify evaluates what it reads, so
the problem's own expression (``\\frac{3}{4} + \\frac{1}{8}``, ``\\sqrt{72}``, ``2^{10}``,
``(x+3)^2`` for "Expand") equals the gold: a reply that gives the prompt back, or boxes its
expression, would be paid for solving nothing. So a correct answer whose final expression is
one the problem states (each of its ``$...$``, ``\\(...\\)`` and ``\\[...\\]`` spans, each
expression written outside them, ``2^10``, and what math-verify reads in the whole problem)
scores 0 (``restates_problem``), unless it is the gold's own form (a problem may name its
answer: "the gcd of 12 and 24"). Expressions are the same when math-verify parses them to the
same unevaluated tree, up to the order of terms and how a fraction of integers is written
(``3/4``, ``\\frac{3}{4}``). An answer that does part of the work (``0.75 + 0.125``) is not a
restatement; one in another form than the gold that the problem also states is one (``0.75``
for "Write $0.75$ as a fraction") or a right answer (``0.75`` for "Which is larger, $0.75$ or
$\\frac{2}{3}$?" whose gold is ``\\frac{3}{4}``): the check cannot tell those apart, so it
scores 0 and says why rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

PARSE_TIMEOUT_S = 5
COMPARE_TIMEOUT_S = 5
FLOAT_ROUNDING = 6
"""Decimal places numbers are compared at (math-verify's ``math_metric`` default)."""
PROBLEM_SPANS = 32
"""Math spans of the problem compared with an answer, at most (the first ones)."""
SPAN_CHARS = 1000
"""Longer spans are not compared: parsing them is slow, and no answer restates them."""


def warm_up() -> None:
    """What a pool worker's first check would pay, paid when the pool starts (with the server,
    ``ResourcesServer.cpu_work``): math-verify's import and its first parse and compare."""
    check_answer("1", "\\boxed{1}")


@cache
def _math_verify() -> tuple[Any, Any, tuple[Any, ...], tuple[Any, ...]]:
    """math-verify's ``parse``, ``verify`` and the extraction targets. Imported in the pool
    worker that runs the checks (``warm_up``, as the pool starts): math-verify brings sympy
    (0.4 s), which the server's own process never needs."""
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
    restates_problem: bool = False
    """math-verify found the answer equal to the gold, but it only restates the problem (then
    ``correct`` is False)."""


def gold_text(expected: str) -> str:
    """``expected`` as math-verify's gold: outer ``\\(...\\)`` and then ``$...$`` removed, the
    rest boxed (bare ``\\sqrt{18}`` would not parse; boxed it does)."""
    expected = expected.strip()
    if expected.startswith("\\(") and expected.endswith("\\)"):
        expected = expected[2:-2].strip()
    if len(expected) > 1 and expected.startswith("$") and expected.endswith("$"):
        expected = expected[1:-1].strip()
    return f"\\boxed{{{expected}}}"


def check_answer(expected: str, answer: str, problem: str = "") -> MathCheck:
    """Whether an answer extracted from ``answer`` equals ``expected``: math-verify's
    ``math_metric`` with ``_math_verify``'s targets, gold first (the comparison is not symmetric);
    an answer that restates ``problem`` is not (module docstring)."""
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
        # Only a correct answer is compared with the problem: a wrong one scores 0 anyway.
        restates = correct and restates_problem(predicted, gold, problem)
    except Exception:
        # An answer that makes math-verify raise is wrong (the gold
        # parsed, so the fault is in the answer).
        return MathCheck(gold_parsed=True, answer_parsed=False, correct=False)
    return MathCheck(
        gold_parsed=True,
        answer_parsed=bool(predicted),
        correct=correct and not restates,
        restates_problem=restates,
    )


def restates_problem(predicted: list[Any], gold: list[Any], problem: str) -> bool:
    """Whether the answer math-verify read (``predicted``) is an expression ``problem`` states
    and not the gold's own form. An equation ``x = ...`` counts by its right side as well, as
    math-verify compares it."""
    stated = problem_expressions(problem)
    if not stated:
        return False
    forms = _forms(predicted)
    return bool(forms & stated) and not forms & _forms(gold)


def _forms(parsed: list[Any]) -> set[str]:
    """The keys of what math-verify read, with the right side of each equation."""
    expressions = _expressions(parsed)
    rhs = [e.rhs for e in expressions if _is_assignment(e)]
    return {expression_key(e) for e in [*expressions, *rhs]}


_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_PLAIN = re.compile(
    r"[\w.!]+(?:\s*[-+*/^]\s*\(?[\w.!]+\)?)+|\([^()]*[-+*/^][^()]*\)(?:\s*[-+*/^]\s*[\w.!]+)*"
)
"""An expression written without math mode: operands joined by operators (``2^10``,
``7!/5!``, ``(x+3)^2``)."""


@lru_cache(maxsize=256)  # a row is verified once per repeat: its problem is parsed once
def problem_expressions(problem: str) -> frozenset[str]:
    """The keys (``expression_key``) of the expressions ``problem`` states: each math span and
    each expression written outside one (the first ``PROBLEM_SPANS`` of them), and what
    math-verify reads in the whole problem (what an answer that echoes it is read as) unless
    that is a bare number or symbol."""
    if not problem.strip():
        return frozenset()
    parse, _, _, answer_targets = _math_verify()
    spans = [next(g for g in m.groups() if g is not None) for m in _SPAN.finditer(problem)]
    plain = [run.rstrip(".,") for run in _PLAIN.findall(_SPAN.sub(" ", problem))]
    texts = [f"${span}$" for span in [*spans, *plain][:PROBLEM_SPANS] if len(span) <= SPAN_CHARS]
    keys: set[str] = set()
    for text in [*texts, problem]:
        try:
            parsed = parse(text, answer_targets, parsing_timeout=PARSE_TIMEOUT_S)
        except Exception:  # a span math-verify cannot read states no expression
            continue
        found = _expressions(parsed)
        if text is problem:
            # Read from the whole text, a bare number is one said in passing ("in 2 steps",
            # "5 shops"), not an expression the problem states; an echo is read as compound.
            found = [e for e in found if not getattr(e, "is_Atom", False)]
        keys.update(expression_key(e) for e in found)
    return frozenset(keys)


_FRACTION = re.compile(r"Mul\(Integer\((-?\d+)\), Pow\(Integer\((\d+)\), Integer\(-1\)\)\)")


def expression_key(expression: Any) -> str:
    """``expression``'s unevaluated tree as text (sympy's ``srepr`` orders the terms of a sum
    and the factors of a product), a fraction of integers written as ``Rational``: plain
    ``3/4`` parses to ``Mul(3, Pow(4, -1))``, LaTeX and boxed ``3/4`` to ``Rational(3, 4)``."""
    from sympy import Rational, srepr  # type: ignore[import-untyped]

    def rational(m: re.Match[str]) -> str:
        return str(srepr(Rational(int(m[1]), int(m[2]))))

    return _FRACTION.sub(rational, str(srepr(expression)))


def _expressions(parsed: list[Any]) -> list[Any]:
    # math-verify's parse answers [sympy expression, the text it was read from].
    return [e for e in parsed if not isinstance(e, str)]


def _is_assignment(expression: Any) -> bool:
    from sympy import Eq, Symbol

    return isinstance(expression, Eq) and isinstance(expression.lhs, Symbol)
