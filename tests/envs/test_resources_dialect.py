"""Adding a protocol to resources servers is a dialect plus one line in the list an entry point
hands its servers (``rollgym.dialects.SERVER_DIALECTS``): no edit in ``rollgym.server``.

The toy dialect here takes ``/seed_session`` bodies ``{"toy_ticket": T, "row": {...}}``, opening
a session its caller names ``T`` (``SessionStore.seed_named``), answered ``{"ticket": T}``; and
adds ``POST /toy/close`` ``{"toy_ticket": T}``, which ends it (or the unnamed session the call
names). Without any dialect a resources server takes task rows only.
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.routing import BaseRoute, Route

from rollgym.dialects import SERVER_DIALECTS
from rollgym.protocol import Reset, Step
from rollgym.server.agent import AgentDialect
from rollgym.server.endpoint import Call, json_endpoint
from rollgym.server.gymnasium import GymnasiumServer
from rollgym.server.resources import ResourcesDialect, ResourcesServer, Session, tool
from rollgym.server.sessions import Prepare, SessionName, SessionStore, session_id
from rollgym.wire import SESSION_COOKIE
from tests.envs.env_client import reply
from tests.support.asgi import TRANSPORTS, build, client

pytestmark = pytest.mark.timeout(60)

ROW = {"responses_create_params": {"input": "count"}, "expected": 2}


class ToyDialect:
    """Sessions named by a ticket, and a close of its own."""

    def routes(self, sessions: SessionStore) -> list[BaseRoute]:
        async def close(body: Any, call: Call) -> dict[str, Any]:
            ended = sessions.close(body["toy_ticket"], "toy", session_id(call))
            return {"closed": ended is not None}

        return [Route("/toy/close", json_endpoint(close), methods=["POST"])]

    def takes(self, body: dict[str, Any]) -> bool:
        return "toy_ticket" in body

    async def seed(
        self, body: dict[str, Any], size: int, sessions: SessionStore, prepare: Prepare
    ) -> tuple[Session, Any]:
        name = SessionName(body["toy_ticket"], "toy", ("toy",))
        session = await sessions.seed_named(name, body["row"], size, prepare)
        return session, {"ticket": name.name}


WITH_TOY = (*SERVER_DIALECTS, ToyDialect())
"""The one line: what an entry point would list."""


class Counter(ResourcesServer):
    """Counts ``bump`` calls in its session; pays 1 when the count is the row's ``expected``."""

    row_fields = frozenset({"expected"})

    @tool
    async def bump(self, session: Session) -> dict[str, Any]:
        """Add one to the session's count."""
        session.data["n"] = session.data.get("n", 0) + 1
        return {"n": session.data["n"]}

    async def verify(self, session: Session, task: dict[str, Any], response: dict[str, Any]) -> Any:
        return float(session.data.get("n", 0) == task["expected"])


class Steps(GymnasiumServer):
    async def step(self, session: Session, response: dict[str, Any]) -> Step:
        return Step("again", 0.0)

    async def reset(self, session: Session) -> Reset:
        return Reset("go")


def test_the_toy_is_a_resources_dialect_and_no_agent_one() -> None:
    assert isinstance(ToyDialect(), ResourcesDialect)
    assert not isinstance(ToyDialect(), AgentDialect)
    # Each listed dialect is of one seam: the list serves every kind of server.
    kinds = [(isinstance(d, AgentDialect), isinstance(d, ResourcesDialect)) for d in WITH_TOY]
    assert all(agent != resources for agent, resources in kinds), kinds


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_listed_dialect_adds_its_seed_bodies_and_routes(transport: str) -> None:
    async with client(transport, build(Counter, dialects=WITH_TOY)) as env:
        seeded = await env.post("/seed_session", {"toy_ticket": "T-1", "row": ROW})
        assert (seeded.status, seeded.body) == (200, {"ticket": "T-1"})
        cookies = seeded.cookies
        assert SESSION_COOKIE in cookies and cookies[SESSION_COOKIE] != "T-1"
        for _ in range(2):
            assert (await env.post("/bump", {}, cookies=cookies)).status == 200
        again = await env.post("/seed_session", {"toy_ticket": "T-1", "row": ROW})
        assert again.cookies == cookies  # the same session: seeded once per name
        verified = await env.post("/verify", {**ROW, "response": reply("x")}, cookies=cookies)
        assert verified.body["reward"] == 1.0
        # A named session outlives its verify, until its close.
        assert (await env.post("/bump", {}, cookies=cookies)).body == {"n": 3}
        closed = await env.post("/toy/close", {"toy_ticket": "T-1"})
        assert (closed.status, closed.body) == (200, {"closed": True})
        assert (await env.post("/bump", {}, cookies=cookies)).status == 404
        reseeded = await env.post("/seed_session", {"toy_ticket": "T-1", "row": ROW})
        assert reseeded.status == 409  # a closed name is not opened again
        # The dialects listed before it, and task rows, are as they were.
        named = {"resources_session_id": "rs", "episode_id": {"rollout_id": "0-0"},
                 "task_id": {"taskset": "t", "task_id": "0"}, "task_data": ROW}  # fmt: skip
        ng07 = await env.post("/seed_session", named)
        assert ng07.status == 200 and ng07.body["resources_session_id"] == "rs"
        row = await env.post("/seed_session", ROW)
        assert row.status == 200 and set(row.body) == {"session_id"}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_gymnasium_server_takes_the_dialects_routes(transport: str) -> None:
    async with client(transport, build(Steps, "steps", dialects=WITH_TOY)) as env:
        reset = await env.post("/reset", ROW)
        step = {**ROW, "response": reply("x")}
        assert (await env.post("/step", step, cookies=reset.cookies)).status == 200
        closed = await env.post("/toy/close", {"toy_ticket": "-"}, cookies=reset.cookies)
        assert (closed.status, closed.body) == (200, {"closed": True})
        assert (await env.post("/step", step, cookies=reset.cookies)).status == 404


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_without_dialects_a_resources_server_takes_task_rows_only(transport: str) -> None:
    async with client(transport, build(Counter, dialects=())) as env:
        # A body no dialect takes is a task row (as 0.7 itself takes a body it does not know).
        seeded = await env.post("/seed_session", {"toy_ticket": "T-1", **ROW})
        assert seeded.status == 200 and set(seeded.body) == {"session_id"}
        for path in ("/toy/close", "/close_session"):
            assert (await env.post(path, {})).status == 404
