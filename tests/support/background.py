"""An async context manager entered on an event loop of its own thread: servers that keep
serving while synchronous code (a sync trainer call, a Ray ``get``) blocks the test's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = 30.0
"""Seconds to enter or leave the context before the test fails."""


@contextmanager
def in_thread(manager: AbstractAsyncContextManager[T]) -> Iterator[T]:
    """Enter ``manager`` on a new event loop in a daemon thread; yield what it yields."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-background", daemon=True)
    thread.start()
    try:
        value = asyncio.run_coroutine_threadsafe(manager.__aenter__(), loop).result(TIMEOUT)
        try:
            yield value
        finally:
            exit_ = manager.__aexit__(None, None, None)
            asyncio.run_coroutine_threadsafe(exit_, loop).result(TIMEOUT)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT)
        loop.close()
