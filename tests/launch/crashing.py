"""Servers that misbehave while starting, for the launcher's failure tests."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from rollgym.server.resources import ResourcesServer, Session


class CrashOnStart(ResourcesServer):
    async def startup(self) -> None:
        raise RuntimeError("cannot open the many-worlds database")

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        return 0.0


class HangOnStart(ResourcesServer):
    """Never finishes starting, and (like a server stuck in a C call) ignores SIGTERM:
    uvicorn only acts on it once startup is over."""

    async def startup(self) -> None:
        print("warming the many-worlds cache", file=sys.stderr, flush=True)
        await asyncio.sleep(3600)

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        return 0.0
