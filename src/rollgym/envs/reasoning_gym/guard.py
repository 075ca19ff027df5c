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
  spaces, names only single letters or functions of ``FUNCTIONS``, no ``.`` before a letter
  (attribute access), and every exponent a number of at most 3 digits or such a fraction in
  parentheses, not itself raised to a power (``9**9**9`` would hang sympy). Any other answer
  is refused before the scorer sees it (``screen``).

``tests/envs/test_reasoning_gym_sweep.py`` fails when a dataset module of the installed version
calls ``eval``/``exec``/``parse_expr`` and is not listed here or in ``EVAL_NOT_ON_ANSWER``: a
new version must be read before it is trusted.
"""

from __future__ import annotations

import ast
import importlib
import re
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
}
"""Datasets whose scorer gives rewards that measure nothing: no row of theirs is made, and a
row of theirs is refused by verify (a wrong reward is worse than none)."""

FUNCTIONS = frozenset(
    {"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "sinh", "cosh",
     "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln", "sqrt", "pi", "oo"}
)  # fmt: skip
_ALLOWED_CHARS = re.compile(r"[A-Za-z0-9\s+\-*/^().,=]*")
_NAME = re.compile(r"[A-Za-z]+")
_ATTRIBUTE = re.compile(r"\.\s*[A-Za-z]")
_POWER = re.compile(r"\*\*|\^")
_SMALL_EXPONENT = re.compile(
    r"\s*(\d{1,3}(?![\d.])|\(\s*-?\d{1,3}\s*(/\s*\d{1,3}\s*)?\))(?!\s*(\*\*|\^))"
)


def screen(dataset: str, answer: str) -> bool:
    """Whether ``answer`` may be given to ``dataset``'s scorer (always, unless it is one that
    sympy parses and the answer is not a plain arithmetic expression)."""
    if dataset not in SYMPY_PARSED:
        return True
    if not _ALLOWED_CHARS.fullmatch(answer) or _ATTRIBUTE.search(answer):
        return False
    # sympy computes a power of numbers exactly: 9**9**9 would run past any deadline (and a
    # failed score counts toward the run's failure budget). References use exponents like
    # 3 and (3/2).
    if any(not _SMALL_EXPONENT.match(answer, m.end()) for m in _POWER.finditer(answer)):
        return False
    return all(len(name) == 1 or name in FUNCTIONS for name in _NAME.findall(answer))


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
