"""Polling until a condition holds, bounded: the test fails with what it waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEFAULT_TIMEOUT = 15.0
"""Seconds before a wait fails: a bound for a condition that never comes, not a measure of
speed (a wait returns as soon as its condition holds), so wide enough for a busy machine."""


async def wait_until(
    predicate: Callable[[], object], timeout: float = DEFAULT_TIMEOUT, what: str = "condition"
) -> None:
    """Poll ``predicate`` on the event loop until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def wait_for(predicate: Callable[[], object], timeout: float, what: str = "condition") -> None:
    """``wait_until`` for synchronous code (blocks the thread while it polls)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
