"""Adding a protocol to agent servers is a dialect plus one line in the list an entry point hands
its servers (``rollgym.dialects.SERVER_DIALECTS``): no edit in ``rollgym.server``.

The toy dialect here takes ``/run`` bodies ``{"toy_task": N}`` (task ``N`` of the echo stack),
answers ``{"toy_reward": r}`` or ``{"toy_failed": type, "phase": where}``, and adds an endpoint
``POST /toy/hello``. Without any dialect the agent speaks its own protocol only: a flat row.
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.dialects import SERVER_DIALECTS
from rollgym.server.agent import AgentDialect, AgentServer
from rollgym.server.endpoint import Call, JSONResponse, json_endpoint
from tests.agents.ng07_stack import episode, post
from tests.support.servers import FAIL_MARKER
from tests.support.stack import running_stack, task_row

pytestmark = pytest.mark.timeout(60)


class ToyDialect:
    """A third shape of ``/run`` body, and an endpoint of its own."""

    def routes(self, agent: AgentServer) -> list[BaseRoute]:
        async def hello(body: Any, call: Call) -> dict[str, Any]:
            return {"agent": agent.name, "speaks": "toy"}

        return [Route("/toy/hello", json_endpoint(hello), methods=["POST"])]

    def takes(self, body: Any) -> bool:
        return isinstance(body, dict) and "toy_task" in body

    async def run(self, agent: AgentServer, body: Any) -> Response:
        index = body["toy_task"]
        attempt = await agent.attempt(task_row(index, fail=bool(body.get("fail"))), f"toy-{index}")
        if attempt.error is not None:
            return JSONResponse({"toy_failed": attempt.error.type, "phase": attempt.failed_in})
        assert attempt.verified is not None
        return JSONResponse({"toy_reward": attempt.verified["reward"]})


WITH_TOY = (*SERVER_DIALECTS, ToyDialect())
"""The one line: what an entry point would list."""


def test_the_toy_is_an_agent_dialect() -> None:
    assert isinstance(ToyDialect(), AgentDialect)


async def test_a_listed_dialect_adds_its_run_bodies_and_routes() -> None:
    failing = {"fail_marker": FAIL_MARKER}
    async with running_stack(agent_dialects=WITH_TOY, model_options=failing) as stack:
        run = stack.agent_url + "/run"
        status, answer, _, _ = await post(run, {"toy_task": 3})
        assert (status, answer) == (200, {"toy_reward": 1.0})
        status, answer, _, _ = await post(run, {"toy_task": 4, "fail": True})
        assert status == 200 and answer["phase"] == "agent", answer  # the model call failed
        assert isinstance(answer["toy_failed"], str)
        status, answer, _, _ = await post(stack.agent_url + "/toy/hello", {})
        assert (status, answer) == (200, {"agent": "agent", "speaks": "toy"})
        # The dialects listed before it, and the agent's own flat rows, are as they were.
        status, flat, _, _ = await post(run, task_row(5))
        assert status == 200 and flat["reward"] == 1.0
        status, ep, _, _ = await post(run, episode(task_row(6)))
        assert status == 200 and ep["result"]["reward"] == 1.0, ep


async def test_without_dialects_an_agent_speaks_flat_rows_only() -> None:
    async with running_stack(agent_dialects=()) as stack:
        run = stack.agent_url + "/run"
        status, flat, _, _ = await post(run, task_row(1))
        assert status == 200 and flat["reward"] == 1.0
        for body in ({"toy_task": 3}, episode(task_row(2))):
            status, answer, _, _ = await post(run, body)
            assert status == 422 and answer["error"]["type"] == "invalid_request", answer
        for path in ("/toy/hello", "/v1/agent_sessions"):
            status, _, _, _ = await post(stack.agent_url + path, {})
            assert status == 404
