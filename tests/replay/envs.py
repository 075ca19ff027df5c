"""Small environments for the replay tests: tools that read a clock, draw a random number or
return a set's order (each differs between a run and its replay), beside a stable one."""

from __future__ import annotations

import random
import time
from typing import Any

from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session, tool

NAMES = [f"m{i}" for i in range(24)]


class _Member:
    """Hashed by identity: a set of them iterates in the order of their addresses."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class NondetEnv(ResourcesServer):
    row_fields = frozenset({"expected_answer"})

    @tool
    async def stable(self, session: Session, key: str) -> dict[str, Any]:
        """A pure function of its argument."""
        return {"key": key, "length": len(key)}

    @tool
    async def clock(self, session: Session) -> dict[str, Any]:
        """Reads the clock."""
        return {"now_ns": time.time_ns()}

    @tool
    async def draw(self, session: Session) -> dict[str, Any]:
        """Draws a random number."""
        return {"draw": random.SystemRandom().random()}

    @tool
    async def members(self, session: Session) -> dict[str, Any]:
        """A set's members, in the set's order."""
        return {"members": [m.name for m in {_Member(n) for n in NAMES}]}

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        expected = str(task.get("expected_answer", ""))
        reward = 1.0 if expected and expected in output_text(response) else 0.0
        return {"reward": reward, "matched": reward}
