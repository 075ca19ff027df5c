"""The tool agent against real model and env servers on 127.0.0.1 (in-process uvicorn)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from openai.types.responses import Response

from rollgym.agents.tool_agent import ToolAgent
from rollgym.config import ServerConfig
from rollgym.errors import ConfigError
from rollgym.server.base import ServerContext
from tests.support.servers import FAIL_MARKER, FAULT_MESSAGE
from tests.support.stack import running_stack, task_row

pytestmark = pytest.mark.timeout(30)

TIMEOUT = aiohttp.ClientTimeout(total=15)


async def post_run(
    url: str, row: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
        session.post(url + "/run", data=orjson.dumps(row), headers=headers) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


async def test_full_rollout_returns_the_verify_response_with_a_reward() -> None:
    async with running_stack() as stack:
        row = {**task_row(7), "task_index": 7, "rollout_index": 1}
        status, body = await post_run(stack.agent_url, row)
    assert status == 200, body
    assert body["reward"] == 1.0
    assert body["expected_answer"] == "v7"  # the task's own fields travel to /verify untouched
    assert body["task_index"] == 7 and body["num_steps"] == 2 and body["truncated"] is False
    response = Response.model_validate(body["response"])
    kinds = [item.type for item in response.output]
    assert kinds == ["function_call", "function_call_output", "message"]
    assert response.output[0].name == "echo"  # type: ignore[union-attr]
    assert response.output_text == 'The answer is {"echo":"v7"}'
    assert stack.env.calls == {"seed_session": 1, "echo": 1, "verify": 1}


async def test_a_tools_422_goes_back_to_the_model_and_the_rollout_still_verifies() -> None:
    turns = [
        {"call": "echo", "arguments": {"txt": "wrong key"}},  # the env answers 422
        {"say": "The tool said: {tool_output}"},
    ]
    async with running_stack() as stack:
        row = {**task_row(0, turns=turns), "expected_answer": "bad arguments for tool echo"}
        status, body = await post_run(stack.agent_url, row)
    assert status == 200, body
    fco = [i for i in body["response"]["output"] if i["type"] == "function_call_output"]
    assert len(fco) == 1
    assert "bad arguments for tool echo" in orjson.loads(fco[0]["output"])["error"]
    # The model saw the refusal as the tool's output, and the verifier scored its answer.
    assert body["reward"] == 1.0
    assert stack.env.calls["echo"] == 0 and stack.env.calls["verify"] == 1


async def test_a_model_failing_500_beyond_its_retries_is_a_502_naming_the_model() -> None:
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        status, body = await post_run(stack.agent_url, task_row(1, fail=True))
        faults = stack.model.faults
    assert status == 502, body
    error = body["error"]
    assert error["type"] == "upstream_error" and error["server"] == "agent"
    origin = error["origin"]
    assert origin["server"] == "model"
    assert origin["status"] == 500
    assert origin["endpoint"] == "/v1/responses"
    assert origin["attempts"] == 3 == faults  # the model's policy: 3 attempts, all answered 500
    assert FAULT_MESSAGE in origin["message"]
    assert stack.env.calls["verify"] == 0


async def test_max_steps_bounds_the_loop() -> None:
    forever = [{"call": "echo", "arguments": {"text": "again"}}]  # the last turn repeats
    async with running_stack(agent_options={"max_steps": 3}) as stack:
        status, body = await post_run(stack.agent_url, {**task_row(0, turns=forever)})
        model_calls = stack.model.requests
    assert status == 200, body
    assert model_calls == 3 and body["num_steps"] == 3 and body["truncated"] is True
    assert stack.env.calls == {"seed_session": 1, "echo": 3, "verify": 1}
    assert body["reward"] == 0.0  # it never answered


async def test_a_caller_that_disconnects_cancels_the_rollout() -> None:
    async with running_stack(model_options={"latency": 1.0}) as stack:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            call = asyncio.create_task(
                session.post(stack.agent_url + "/run", data=orjson.dumps(task_row(0)))
            )
            async with asyncio.timeout(30):
                await stack.model.requested.wait()  # the rollout is waiting on the model
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        # Without the cancel, the model answers after 1 s and the agent calls the tool next.
        await asyncio.sleep(1.6)
        assert stack.env.calls["seed_session"] == 1
        assert stack.env.calls["echo"] == 0
        assert stack.env.calls["verify"] == 0
        assert stack.model.requests == 1


async def test_every_call_of_a_rollout_carries_its_rollout_id() -> None:
    async with running_stack() as stack:
        stamped = {**task_row(2), "task_index": 2, "rollout_index": 5}
        await post_run(stack.agent_url, stamped)
        await post_run(stack.agent_url, stamped, headers={"x-rollgym-rollout": "9:9"})
        await post_run(stack.agent_url, task_row(0))  # unstamped: its own fresh id
        await post_run(stack.agent_url, task_row(0))
        ids = stack.model.rollout_ids
    assert ids[:4] == ["2:5", "2:5", "9:9", "9:9"]  # the caller's header wins
    fresh = ids[4:]
    assert fresh[0] == fresh[1] and fresh[2] == fresh[3] and fresh[0] != fresh[2]
    assert all(len(i or "") == 32 for i in fresh)


def test_max_steps_below_one_is_a_config_error() -> None:
    cfg = ServerConfig(kind="agent", impl="tool_agent", options={"max_steps": 0})
    with pytest.raises(ConfigError, match=r"servers\.agent\.options\.max_steps: Input should be"):
        ToolAgent(ServerContext("agent", cfg))


def test_options_are_typed_once_with_their_defaults() -> None:
    cfg = ServerConfig(kind="agent", impl="tool_agent", options={"max_steps": "3"})
    agent = ToolAgent(ServerContext("agent", cfg))
    assert agent.options.max_steps == 3 and agent.options.model == "model"
    assert agent.options.tool_timeout == 120.0
