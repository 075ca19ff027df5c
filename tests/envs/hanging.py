"""A math check that hangs on demand. Its own small module: a pool worker imports it, and
importing the test module there (pytest, aiohttp, openai) would cost seconds per worker."""

from __future__ import annotations

import time

from rollgym.envs.math.check import MathCheck, check_answer

HANG = "this answer makes the check hang"


def hanging_check(expected: str, answer: str, problem: str = "") -> MathCheck:
    """``check_answer``, except that it does not finish in time for ``HANG``."""
    if answer == HANG:
        time.sleep(60)
    return check_answer(expected, answer, problem)
