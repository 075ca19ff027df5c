"""A server that dies while starting, for the supervisor's launch-failure test."""

from __future__ import annotations

from typing import Any

from rollgym.server.resources import ResourcesServer, Session


class CrashOnStart(ResourcesServer):
    async def startup(self) -> None:
        raise RuntimeError("cannot open the many-worlds database")

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        return 0.0
