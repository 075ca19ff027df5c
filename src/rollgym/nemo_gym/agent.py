"""NeMo Gym 0.7's agent-server side as a dialect (``rollgym.server.agent.AgentDialect``).

With it an agent is a 0.7 Environment Server itself: its ``/run`` takes 0.7's episode requests
(``rollgym.nemo_gym.agent_episodes``) beside flat task rows; and an agent that implements
``turn`` takes 0.7's agent sessions (``rollgym.nemo_gym.agent_sessions``: ``/v1/agent_sessions``,
``/v1/responses``, close), so a 0.7 Environment Server (``single_agent_turn``) can front it.
Listed by the entry points in ``rollgym.dialects``.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response
from starlette.routing import BaseRoute

from rollgym.nemo_gym.agent_episodes import (
    episode_failed,
    episode_result,
    is_episode_body,
    read_episode,
)
from rollgym.nemo_gym.agent_sessions import AgentSessions
from rollgym.server.agent import AgentServer
from rollgym.server.endpoint import JSONResponse
from rollgym.wire import HEADER_ROLLOUT


class EpisodesAndSessions:
    """0.7's episodes on ``/run`` and its agent sessions."""

    def routes(self, agent: AgentServer) -> list[BaseRoute]:
        # One session store per agent, held by the endpoints it serves.
        return AgentSessions(agent).routes()

    def takes(self, body: Any) -> bool:
        return is_episode_body(body)

    async def run(self, agent: AgentServer, body: Any) -> Response:
        """An episode request: the same rollout a flat row runs, its id the episode's capture
        key, answered as an episode response (200 with ``result`` or ``failure``)."""
        request, row = read_episode(body)
        attempt = await agent.attempt(row, request.episode_id.capture_key)
        if attempt.error is not None:
            answer = episode_failed(request, attempt.error, attempt.failed_in, attempt.spent)
        else:
            assert attempt.verified is not None
            answer = episode_result(request, attempt.verified)
        return JSONResponse(answer, headers={HEADER_ROLLOUT: attempt.rollout})


AGENT_DIALECT = EpisodesAndSessions()

__all__ = ["AGENT_DIALECT", "EpisodesAndSessions"]
