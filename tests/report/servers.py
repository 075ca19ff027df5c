"""A deliberately changed verifier, for ``rollgym reverify`` (server processes import it)."""

from __future__ import annotations

from typing import Any

from rollgym.envs.echo.server import EchoEnv
from rollgym.server.resources import Session


def changed(task: dict[str, Any]) -> bool:
    """The tasks whose reward the changed verifier takes away: ``v0``, ``v3``, ``v6``..."""
    return int(str(task["expected_answer"]).lstrip("v")) % 3 == 0


class StricterEcho(EchoEnv):
    """The echo env, but a right answer to every third task scores 0."""

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        reward = await super().verify(session, task, response)
        return 0.0 if changed(task) else reward
