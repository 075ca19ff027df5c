"""Red team: tool calls a policy under training may emit. Each one goes back to the model as a
tool error (``function_call_output`` saying what was wrong) and the rollout is verified as
usual; none reaches an endpoint it must not, and none makes the agent answer 500."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.agents.test_tool_agent import post_run
from tests.support.stack import ECHO_TOOL, running_stack, task_row

pytestmark = pytest.mark.timeout(60)

DEEP = '{"text": ' + "[" * 300 + "]" * 300 + "}"  # orjson reads 1,024 levels, writes 255


def _tool_errors(body: dict[str, Any]) -> list[str]:
    outputs = [o for o in body["response"]["output"] if o["type"] == "function_call_output"]
    return [orjson.loads(o["output"]).get("error", "") for o in outputs]


async def _healthy(url: str) -> bool:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(url + "/health") as resp:
        return resp.status == 200


def _calling(arguments: Any, name: str = "echo") -> dict[str, Any]:
    turns = [{"call": name, "arguments": arguments}, {"say": "The answer is v0"}]
    return task_row(0, turns=turns)


async def test_arguments_nested_300_deep_are_a_tool_error_not_a_500() -> None:
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, _calling(DEEP))
        assert await _healthy(stack.agent_url)
        assert stack.env.calls["echo"] == 0  # never sent
    assert status == 200, body
    [error] = _tool_errors(body)
    assert "cannot be passed on as JSON" in error
    assert body["reward"] == 1.0  # the rollout went on and was verified as usual


async def test_arguments_past_the_size_limit_are_a_tool_error() -> None:
    big = orjson.dumps({"text": "x" * 5000}).decode()
    async with running_stack(agent_options={"max_tool_argument_bytes": 1000}) as stack:
        status, body = await post_run(stack.agent_url, _calling(big))
        assert stack.env.calls["echo"] == 0
    assert status == 200, body
    [error] = _tool_errors(body)
    assert "exceed the 1000 allowed" in error


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        # Already answered as tool errors before this suite; kept so they stay so.
        ('{"text": NaN}', "not valid JSON"),
        ('{"text": 1e400}', "not valid JSON"),
        ('{"text": "\\ud800"}', "not valid JSON"),  # a lone surrogate
        ('{"text": "unterminated', "not valid JSON"),
        ("[" * 2000 + "]" * 2000, "not valid JSON"),  # past orjson's 1,024 levels
        ('["a", "list"]', "must be a JSON object"),
        ("42", "must be a JSON object"),
    ],
)
async def test_unusable_arguments_are_tool_errors(arguments: str, says: str) -> None:
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, _calling(arguments))
        assert stack.env.calls["echo"] == 0
    assert status == 200, body
    [error] = _tool_errors(body)
    assert says in error


@pytest.mark.parametrize(
    "name", ["verify", "seed_session", "stats", "aggregate_metrics", "tools", "health", "nope"]
)
async def test_a_tool_that_is_not_declared_never_reaches_the_server(name: str) -> None:
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, _calling({}, name))
        assert stack.env.calls["verify"] == 1 and stack.env.calls["seed_session"] == 1
    assert status == 200, body
    assert _tool_errors(body) == [f"unknown tool {name!r}"]


@pytest.mark.parametrize("name", ["verify", "seed_session", "stats", "aggregate_metrics"])
async def test_a_reserved_endpoint_stays_unreachable_even_when_a_row_declares_it(
    name: str,
) -> None:
    row = _calling({"expected_answer": "x", "response": {"output": []}}, name)
    row["responses_create_params"]["tools"] = [ECHO_TOOL, {**ECHO_TOOL, "name": name}]
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, row)
        assert stack.env.calls["verify"] == 1 and stack.env.calls["seed_session"] == 1
    assert status == 200, body
    assert _tool_errors(body) == [f"unknown tool {name!r}"]
    assert body["reward"] == 1.0
