"""An async context manager entered on an event loop of its own thread: servers that keep
serving while synchronous code (a sync trainer call, a Ray ``get``) blocks the test's thread.
The helper is ``rollgym.testing.in_thread`` (the GRPO example uses it too)."""

from __future__ import annotations

from rollgym.testing import in_thread

__all__ = ["in_thread"]
