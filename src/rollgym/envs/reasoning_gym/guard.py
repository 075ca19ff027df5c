"""Defences for the scorers of reasoning-gym 0.1.25 that evaluate the model's answer as code.

Four scorers call Python's ``eval`` on the answer (to accept a Python list as an alternative
form): string_insertion, spiral_matrix, binary_matrix, n_queens. Five pass it to sympy's
``parse_expr``, which ends in ``eval`` too: countdown, puzzle24, simple_integration,
intermediate_integration, polynomial_multiplication. Unguarded, an answer is code run in the
scorer's worker: it can read the host's files, and, since a worker scores many rollouts, it can
patch the scorer so that every later answer it scores earns 1.0. An answer
``integrate(2*x, x) + C`` would also let sympy do the integral it was asked for.

- ``eval`` is replaced, in those four modules only, by ``ast.literal_eval``: a Python literal is
  all the scorers meant to read (``"['a', 'b']"``), and a literal runs no code.
- A sympy-parsed answer must be an arithmetic expression: digits, letters, ``+-*/^().,=`` and
  spaces, names only single letters or functions of ``FUNCTIONS``, but not sympy's callables
  ``N``, ``O``, ``Q``, ``S`` (``N(pi, 3000000)`` asks for three million digits), no ``.`` before a letter (attribute access), numbers of at most
  ``MAX_DIGITS`` digits, and every exponent a number of at most 2 digits or such a fraction in
  parentheses, neither itself raised to a power nor applied to a power (``9**9**9`` and
  ``(9**99)**99`` would hang sympy). References use exponents up to 10.
- countdown and puzzle24 take arithmetic on the row's numbers: digits, ``+-*/()`` and spaces,
  no ``**`` or ``//``. A letter there is a free value: ``x/x`` is a 1 the row never gave, and
  ``E`` or ``pi`` are others. puzzle24's scorer checks that four numbers in its range are used,
  not which: ``1*2*3*4`` is 24 on every row; its answer must use the row's ``numbers``.
- Everywhere: an answer holding ``nan`` or ``inf`` (as Python's ``float``, ``complex`` and
  ``json`` read them) or a number past a float's range (``1e999``, 300 digits) is refused
  unless the reference holds the same: complex_arithmetic's ``min(1.0, exp(-distance))`` is 1.0 when
  the distance is NaN.

- A sympy-parsed answer must also be of the reference's size, give or take a margin for
  another form of it (``_sized_like``): no one-letter name the reference lacks (but ``C``),
  and bounded length, nesting, calls, powers, largest exponent and exponents' sum. The
  scorers simplify answer minus reference, and ``(x+a+b+c+d+e+f)**99`` or 100 nested ``sin``
  (short, and past every check above) held a worker past the deadline: a failed rollout, not
  a 0, so a wrong answer cost the policy nothing.

Any answer refused is scored 0 before the scorer sees it (``screen``, which says why).

``tests/envs/test_reasoning_gym_sweep.py`` fails when a dataset module of the installed version
calls ``eval``/``exec``/``parse_expr`` and is not listed here or in ``EVAL_NOT_ON_ANSWER``: a
new version must be read before it is trusted.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from typing import Any

EVAL_ON_ANSWER = (
    "reasoning_gym.algorithmic.string_insertion",
    "reasoning_gym.algorithmic.spiral_matrix",
    "reasoning_gym.algorithmic.binary_matrix",
    "reasoning_gym.games.n_queens",
)
"""Modules whose scorer calls the builtin ``eval`` on the answer."""

SYMPY_PARSED = frozenset(
    {
        "countdown",
        "puzzle24",
        "simple_integration",
        "intermediate_integration",
        "polynomial_multiplication",
    }
)
"""Datasets whose scorer gives the answer to sympy's ``parse_expr``."""

EVAL_NOT_ON_ANSWER = {
    "reasoning_gym.arithmetic.basic_arithmetic": "eval of its own generated expression",
    "reasoning_gym.arithmetic.bitwise_arithmetic": "eval of the row's metadata.problem",
    "reasoning_gym.algorithmic.number_sorting": "eval of the row's answer (JSON fallback)",
    "reasoning_gym.code.codeio": "exec of its bundled programs, at generation",
    "reasoning_gym.logic.propositional_logic": "its own parse_expr, a recursive parser",
}
"""Modules that evaluate code, but never the model's answer (read from 0.1.25's source)."""

BROKEN = {
    "game_of_life_halting": "its score_answer compares bool(answer) with bool(entry['answer']), "
    "and both are non-empty strings: every non-empty answer scores 1.0",
    "coin_flip": "its partial credit divides the matching prefix by the shorter string: any "
    "prefix of the reference scores 1.0 ('0' for 0.125)",
}
"""Datasets whose scorer gives rewards that measure nothing: no row of theirs is made, and a
row of theirs is refused by verify (a wrong reward is worse than none)."""

FUNCTIONS = frozenset(
    {"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "sinh", "cosh",
     "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln", "sqrt", "pi", "oo"}
)  # fmt: skip
SYMPY_CALLABLES = frozenset({"N", "O", "Q", "S"})
"""sympy's one-letter names that are callables (``from sympy import *`` brings them)."""
MAX_DIGITS = 12
"""Digits of one number in a sympy-parsed answer (references: at most 7)."""
ARITHMETIC_ONLY = frozenset({"countdown", "puzzle24"})
"""Datasets whose answer is arithmetic on the row's own numbers."""

_ALLOWED_CHARS = re.compile(r"[A-Za-z0-9\s+\-*/^().,=]*")
_ARITHMETIC = re.compile(r"[0-9\s+\-*/()]*")
_NAME = re.compile(r"[A-Za-z]+")
_NUMBER = re.compile(r"\d+")
_ATTRIBUTE = re.compile(r"\.\s*[A-Za-z]")
_POWER = re.compile(r"\*\*|\^")
_EXPONENT = re.compile(r"(?:\*\*|\^)\s*\(?\s*-?(\d+)")
_CALL = re.compile(r"[A-Za-z]{2,}\s*\(")
_SMALL_EXPONENT = re.compile(
    r"\s*(\d{1,2}(?![\d.])|\(\s*-?\d{1,2}\s*(/\s*\d{1,2}\s*)?\))(?!\s*(\*\*|\^))"
)
# What float(), complex() and json.loads read as NaN or infinity: "nan", "-Infinity", "nanj",
# "infj", "nani" (complex_arithmetic's unit); "banana" and "infinite" are words.
_NON_FINITE = re.compile(r"(?i)(?<![a-z])(nan|inf(inity)?)(?![a-hk-z]|[ij][a-z])")
# A float past 1e308 is inf: "1e999", "1e9_99" (float() reads underscores), 309+ digits. The
# exponent is matched from its "e" (after a digit, or a digit and "."), and a digit may follow
# at most one "_": no two quantifiers overlap, so no answer makes this slow (the mantissa's
# "[\d_]*\.?[\d_]*" before made "1_" * 600 take seconds, cubic).
_HUGE = re.compile(r"(?:(?<=\d)|(?<=\d\.))[eE][+-]?\d(?:_?\d){2,}|\d(?:_?\d){299,}")


def screen(dataset: str, answer: str, entry: dict[str, Any] | None = None) -> str | None:
    """Why ``answer`` may not be given to ``dataset``'s scorer, or None if it may. ``entry``
    (``question``, ``answer``, ``metadata``) is the row's, for the checks that read it."""
    reference = entry.get("answer") if entry else None
    reference = reference if isinstance(reference, str) else ""
    for pattern, what in (
        (_NON_FINITE, "NaN or infinity"),
        (_HUGE, "a number past a float's range"),
    ):
        found = {m.group(0).lower() for m in pattern.finditer(answer)}
        if found - {m.group(0).lower() for m in pattern.finditer(reference)}:
            return f"{what} ({sorted(found)[0]!r}), which the reference does not hold"
    if dataset in ARITHMETIC_ONLY:
        why = _arithmetic(dataset, answer, entry)
        if why:
            return why
    if dataset in SYMPY_PARSED:
        return _expression(answer) or _sized_like(answer, reference)
    return None


def _arithmetic(dataset: str, answer: str, entry: dict[str, Any] | None) -> str | None:
    if not _ARITHMETIC.fullmatch(answer) or "**" in answer or "//" in answer:
        return "not arithmetic of numbers with + - * / and parentheses"
    if dataset == "puzzle24":
        given = (entry or {}).get("metadata", {}).get("numbers")
        used = sorted(int(n) for n in _NUMBER.findall(answer))
        if not isinstance(given, list) or used != sorted(given):
            return f"uses the numbers {used}, not the row's {given}"
    return None


def _expression(answer: str) -> str | None:
    if not _ALLOWED_CHARS.fullmatch(answer) or _ATTRIBUTE.search(answer):
        return "not a plain arithmetic expression"
    if any(len(n) > MAX_DIGITS for n in _NUMBER.findall(answer)):
        return f"a number of more than {MAX_DIGITS} digits"
    # sympy computes a power of numbers exactly: 9**9**9 or (9**99)**99 would run past any
    # deadline (and a failed score counts toward the run's failure budget).
    for m in _POWER.finditer(answer):
        if not _SMALL_EXPONENT.match(answer, m.end()):
            return "an exponent that is not a number of at most 2 digits"
        if _POWER.search(_base(answer, m.start())):
            return "a power of a power"
    for name in _NAME.findall(answer):
        if name in SYMPY_CALLABLES or (len(name) > 1 and name not in FUNCTIONS):
            return f"the name {name!r}"
    return None


@dataclass(frozen=True)
class _Shape:
    """What makes sympy's work on an expression grow: its length, parenthesis depth, function
    calls, powers (how many, the largest exponent, their sum: the degree a product can reach)
    and one-letter names."""

    length: int
    depth: int
    calls: int
    powers: int
    max_exponent: int
    exponent_sum: int
    letters: frozenset[str] = frozenset()

    @classmethod
    def of(cls, text: str) -> _Shape:
        depth = deepest = 0
        for ch in text:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            deepest = max(deepest, depth)
        exponents = [int(n) for n in _EXPONENT.findall(text)]
        return cls(
            length=len(text), depth=deepest, calls=len(_CALL.findall(text)),
            powers=len(exponents), max_exponent=max(exponents, default=0),
            exponent_sum=sum(exponents),
            letters=frozenset(n for n in _NAME.findall(text) if len(n) == 1),
        )  # fmt: skip


_LARGEST_REFERENCE = _Shape(
    length=128, depth=1, calls=4, powers=8, max_exponent=10, exponent_sum=44
)
"""The largest of 0.1.25's references, figure by figure: the bounds of an answer whose row
gives no reference."""


def _sized_like(answer: str, reference: str) -> str | None:
    """Why a sympy-parsed answer is out of proportion to the row's reference, or None. The
    scorers simplify the difference of answer and reference (the integrals differentiate the
    answer first), which an answer of 23 characters can keep running past any deadline (still
    running after 40 s): ``(x+a+b+c+d+e+f)**99``, 100 nested ``sin``, a product of 39 powers of
    99. A right answer is the reference's size or near it; the bounds leave room for another
    form of it (factored, expanded, another constant): each a margin over the reference's own
    figure (or ``_LARGEST_REFERENCE``'s, for a row without one)."""
    got = _Shape.of(answer)
    if reference:
        ref = _Shape.of(reference)
        letters = got.letters - ref.letters - {"C"}  # C: the constant of integration
        if letters:
            return f"the name {sorted(letters)[0]!r}, which the reference does not hold"
    else:  # no reference given: the largest of 0.1.25's, and two names (a variable and C)
        ref = _LARGEST_REFERENCE
        if len(got.letters - {"C", "E", "I"}) > 1:  # E and I: sympy's e and i, values
            return f"the names {sorted(got.letters)}: more than one variable"
    for what, value, bound in (
        ("characters", got.length, 4 * ref.length + 120),
        ("nested parentheses", got.depth, ref.depth + 4),
        ("function calls", got.calls, 2 * ref.calls + 4),
        ("powers", got.powers, 2 * ref.powers + 6),
        ("as exponent", got.max_exponent, max(ref.max_exponent, 2) + 3),
        ("as the exponents' sum", got.exponent_sum, 2 * ref.exponent_sum + 12),
    ):
        if value > bound:
            return f"{value} {what}, past the {bound} a form of this reference needs"
    return None


def _base(answer: str, end: int) -> str:
    """The text of the power's base that ends at ``end``: a parenthesised group, else the
    last operand."""
    i = end
    while i > 0 and answer[i - 1].isspace():
        i -= 1
    if i > 0 and answer[i - 1] == ")":
        depth = 0
        for j in range(i - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(answer[j], 0)
            if depth == 0:
                return answer[j:i]
        return answer[:i]
    return ""


def _literal(source: Any, *_: Any) -> Any:
    """What the guarded scorers get for ``eval``: a Python literal or an exception."""
    if not isinstance(source, str):
        raise TypeError("only a string is evaluated")
    return ast.literal_eval(source)


def install() -> None:
    """Shadow ``eval`` in the modules of ``EVAL_ON_ANSWER`` (a name in a module's globals is
    found before the builtin). Run in each scoring worker before its first score."""
    for name in EVAL_ON_ANSWER:
        module = importlib.import_module(name)
        module.eval = _literal  # type: ignore[attr-defined]
