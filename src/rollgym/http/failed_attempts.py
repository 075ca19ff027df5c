"""The failed attempts of the calls a task makes, for a caller that must know what they cost.

A call's retry loop (``rollgym.http.client``) hides its failed attempts from its caller: the
caller gets the answer, or the last error. A failed attempt may still have been billed (a
provider that answers 500 after it generated), so an agent that meters its model calls
(``rollgym.server.agent.RunContext.respond``) opens a sink around the call (``collecting``),
and the loop puts each failed attempt's error there: one context variable read per failed
attempt, nothing on a call that succeeds at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from rollgym.errors import RollgymError

SINK: ContextVar[list[RollgymError] | None] = ContextVar("rollgym_failed_attempts", default=None)


@contextmanager
def collecting() -> Iterator[list[RollgymError]]:
    """The failed attempts of the calls made inside the block, in order."""
    sink: list[RollgymError] = []
    token = SINK.set(sink)
    try:
        yield sink
    finally:
        SINK.reset(token)


def failed(err: RollgymError) -> None:
    """One attempt failed with ``err`` (the retry loop's)."""
    sink = SINK.get()
    if sink is not None:
        sink.append(err)
