"""Red team: what every resources server does with hostile names and bodies, whatever the
environment: the reserved endpoints come from one list, and a row the server accepted is
answered, never turned into a 500 on the way out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rollgym.envs.echo.server import EchoEnv
from rollgym.server.resources import ResourcesServer, Session, tool
from rollgym.testing import serve_server
from rollgym.wire import RESERVED_ENDPOINTS
from tests.envs.env_client import EnvClient, reply

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("name", sorted(RESERVED_ENDPOINTS))
def test_a_tool_named_like_a_reserved_endpoint_is_refused_at_definition(name: str) -> None:
    # `stats` was missing from the servers' own list, so a tool could take over /stats.
    async def handler(self: Any, session: Session, text: str) -> str:
        return text

    handler.__name__ = name
    with pytest.raises(TypeError, match=r"clashes with a reserved name \(an endpoint or a server"):
        type("Hijack", (ResourcesServer,), {name: tool(handler)})


@pytest.mark.parametrize(
    ("name", "why"),
    [("Verify", "clashes with a reserved name"), ("_private", "is no name an agent calls")],
)
def test_a_tool_no_agent_would_call_is_refused_at_definition(name: str, why: str) -> None:
    # Served at /Verify or /_private, it would be refused by every agent (is_tool_name).
    async def handler(self: Any, session: Session, text: str) -> str:
        return text

    handler.__name__ = name
    with pytest.raises(TypeError, match=why):
        type("Unreachable", (ResourcesServer,), {name: tool(handler)})


async def test_a_row_nested_past_what_orjson_writes_is_answered(
    connect: Callable[[str], EnvClient],
) -> None:
    deep: Any = "v0"
    for _ in range(400):  # orjson reads 1,024 levels but writes only 255
        deep = [deep]
    row = {"responses_create_params": {"input": "say v0"}, "expected_answer": "v0", "deep": deep}
    async with serve_server(EchoEnv, name="env") as (url, _):
        status, body = await connect(url).request(
            "POST", "/verify", {**row, "response": reply("v0")}
        )
    assert status == 200, body
    assert body["reward"] == 1.0 and body["deep"] == deep
