"""LookupEnv over real HTTP: the tool, its errors, sessions and the verifier."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from rollgym.envs.lookup.knowledge import ENTRIES, PRODUCTS, TOWNS
from rollgym.envs.lookup.server import LookupEnv, contains_answer
from rollgym.testing import serve_server

TASK: dict[str, Any] = {
    "responses_create_params": {"input": "How many people live in Brackenholt?"},
    "expected_answer": "48213",
}

pytestmark = pytest.mark.timeout(30)


async def test_tools_endpoint_serves_the_lookup_schema(connect: Callable[..., Any]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        status, tools = await connect(url).request("GET", "/tools")
    assert status == 200
    assert tools == [LookupEnv.tools["lookup"].schema()]
    (schema,) = tools
    assert schema["type"] == "function" and schema["name"] == "lookup"
    assert schema["parameters"]["properties"]["key"]["type"] == "string"
    assert schema["parameters"]["required"] == ["key"]
    assert schema["parameters"]["additionalProperties"] is False
    assert "\n" not in schema["description"] and schema["description"]


async def test_lookup_returns_the_entry_whatever_the_case(connect: Callable[..., Any]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        sid = await env.seed(TASK)
        status, town = await env.call("lookup", {"key": "  kestrel   POINT "}, sid)
        assert status == 200
        assert town == {"key": "Kestrel Point", "kind": "town", **TOWNS["Kestrel Point"]}
        status, product = await env.call("lookup", {"key": "qx-4471"}, sid)
        assert status == 200
        assert product["product"] == PRODUCTS["QX-4471"]["product"]
        assert product["kind"] == "product"


async def test_bad_arguments_answer_422(connect: Callable[..., Any]) -> None:
    bad: list[Any] = [{}, {"key": 5}, {"key": None}, {"key": "Velmora", "x": 1}, ["Velmora"], "x"]
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        for arguments in bad:
            status, body = await env.call("lookup", arguments)
            assert status == 422, arguments
            assert body["error"]["type"] == "invalid_request"
            assert body["error"]["server"] == "lookup"


async def test_unknown_key_answers_404_with_a_suggestion(connect: Callable[..., Any]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        status, body = await connect(url).call("lookup", {"key": "Velmorra"})
        assert status == 404
        assert body["error"]["type"] == "invalid_request"
        assert "Velmorra" in body["error"]["message"]
        assert "did you mean 'Velmora'" in body["error"]["message"]
        status, body = await connect(url).call("lookup", {"key": "Atlantis"})
        assert status == 404
        assert "did you mean" not in body["error"]["message"]


async def test_verify_pays_the_right_value_after_a_lookup(connect: Callable[..., Any]) -> None:
    cases = [
        ("Brackenholt has 48213 residents.", 1.0),
        ("The population is 48,213.", 1.0),
        ('Registry: {"key":"Brackenholt","population":48213}.', 1.0),
        ("The population is 48,231.", 0.0),
        ("About 148213 people.", 0.0),  # the number must stand alone
        ("I could not find it.", 0.0),
        ("", 0.0),
    ]
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        for text, reward in cases:
            sid = await env.seed(TASK)
            status, _ = await env.call("lookup", {"key": "Brackenholt"}, sid)
            assert status == 200
            status, verified = await env.verify(TASK, text, sid)
            assert status == 200
            assert verified["reward"] == reward, text
            assert verified["tool_called"] == 1
            assert verified["expected_answer"] == "48213"  # the row comes back with the scores


async def test_a_right_answer_without_the_tool_earns_nothing(connect: Callable[..., Any]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        sid = await env.seed(TASK)
        status, verified = await env.verify(TASK, "Brackenholt has 48213 residents.", sid)
    assert status == 200
    assert verified["reward"] == 0.0
    assert verified["tool_called"] == 0


async def test_a_failed_lookup_is_not_a_source(connect: Callable[..., Any]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        sid = await env.seed(TASK)
        status, _ = await env.call("lookup", {"key": "Brackenhollt"}, sid)
        assert status == 404
        status, verified = await env.verify(TASK, "It has 48213 residents.", sid)
    assert (verified["tool_called"], verified["reward"]) == (0, 0.0)
    assert verified["reason"] == "not_looked_up"


async def test_concurrent_sessions_are_isolated(connect: Callable[..., Any]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, server):
        env = connect(url)
        first, second = await asyncio.gather(env.seed(TASK), env.seed(TASK))
        assert first != second
        results = await asyncio.gather(
            *(env.call("lookup", {"key": "Brackenholt"}, first) for _ in range(5))
        )
        assert all(status == 200 for status, _ in results)
        assert isinstance(server, LookupEnv)
        answer = "Brackenholt has 48213 residents."
        (s1, v1), (s2, v2) = await asyncio.gather(
            env.verify(TASK, answer, first), env.verify(TASK, answer, second)
        )
    assert (s1, s2) == (200, 200)
    assert (v1["reward"], v1["tool_called"]) == (1.0, 1)
    assert (v2["reward"], v2["tool_called"]) == (0.0, 0)


async def test_verify_ends_the_session(connect: Callable[..., Any]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        sid = await env.seed(TASK)
        assert (await env.verify(TASK, "48213", sid))[0] == 200
        status, body = await env.verify(TASK, "48213", sid)
    assert status == 404
    assert "unknown session" in body["error"]["message"]


async def test_verify_rejects_a_task_without_expected_answer(
    connect: Callable[..., Any],
) -> None:
    task = {"responses_create_params": {"input": "?"}}
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        status, body = await connect(url).verify(task, "48213")
    assert status == 422
    assert "expected_answer" in body["error"]["message"]


async def test_aggregate_metrics_reports_the_tool_call_rate(connect: Callable[..., Any]) -> None:
    rollouts = [
        {"reward": 1.0, "tool_called": 1},
        {"reward": 0.0, "tool_called": 0},
        {"reward": 1.0, "tool_called": 1},
        {"reward": 0.0, "tool_called": 1},
    ]
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        status, metrics = await env.request("POST", "/aggregate_metrics", {"rollouts": rollouts})
        assert status == 200
        assert metrics == {"tool_call_rate": 0.75}
        status, empty = await env.request(
            "POST", "/aggregate_metrics", {"rollouts": [{"reward": 1.0}]}
        )
    assert (status, empty) == (200, {})


@pytest.mark.parametrize(
    ("text", "expected", "found"),
    [
        ("Teodor Quill is the mayor.", "Teodor Quill", True),
        ("teodor  quill", "Teodor Quill", True),
        ("Teodor Quillan", "Teodor Quill", False),
        ("It costs €37.", "37", True),
        ("It costs €370.", "37", False),
        ("130,552 people", "130552", True),
        ("1,30552", "130552", False),
        ("anything", "", False),
    ],
)
def test_contains_answer(text: str, expected: str, found: bool) -> None:
    assert contains_answer(text, expected) is found


def test_registry_keys_are_unique_case_insensitively() -> None:
    assert len({key.casefold() for key in ENTRIES}) == len(ENTRIES)
    assert all(p["warehouse"] in TOWNS for p in PRODUCTS.values())
