"""The scripted model on a real socket, with the real ``openai`` SDK as its client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from rollgym.models.scripted import NO_SCRIPT_ANSWER
from rollgym.testing import serve_server

pytestmark = pytest.mark.timeout(30)

ECHO_TOOL = {
    "type": "function",
    "name": "echo",
    "description": "Return the text unchanged.",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "strict": True,
}
SCRIPT = [
    {"call": "echo", "arguments": {"text": "v1"}},
    {"say": ["The answer is {tool_output}", "no idea"]},
]


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with serve_server("scripted", name="model") as (base, _):
        yield base


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10)


def metadata(script: list[dict[str, Any]]) -> dict[str, str]:
    # The SDK's metadata values are strings: the script travels as its JSON text.
    return {"rollgym_script": json.dumps(script)}


async def test_responses_follow_the_script_turn_by_turn(url: str) -> None:
    async with client(url) as sdk:
        first = await sdk.responses.create(
            model="scripted", input="echo v1 please", tools=[ECHO_TOOL], metadata=metadata(SCRIPT)
        )
        assert isinstance(first, Response)
        assert first.status == "completed" and first.output_text == ""
        [call] = first.output
        assert call.type == "function_call" and call.name == "echo"
        assert json.loads(call.arguments) == {"text": "v1"}

        history: list[Any] = [
            {"role": "user", "content": "echo v1 please"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "echo",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"echo":"v1"}'},
        ]
        second = await sdk.responses.create(
            model="scripted",
            input=history,
            tools=[ECHO_TOOL],
            metadata=metadata(SCRIPT),
            extra_headers={"x-rollgym-rollout": "0:0"},
        )
    assert [item.type for item in second.output] == ["message"]
    assert second.output_text in ('The answer is {"echo":"v1"}', "no idea")
    assert second.model == "scripted"
    assert second.usage is not None and second.usage.total_tokens > 0


async def test_a_raw_response_validates_as_an_openai_response(url: str) -> None:
    params = {
        "model": "m",
        "input": "hi",
        "tools": [ECHO_TOOL],
        # A task file may carry the script as a JSON list rather than its text.
        "metadata": {"rollgym_script": SCRIPT},
        "temperature": 0.7,
    }
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.post(url + "/v1/responses", json=params) as resp,
    ):
        assert resp.status == 200
        raw = orjson.loads(await resp.read())
    parsed = Response.model_validate(raw)
    assert parsed.output[0].type == "function_call"
    assert parsed.temperature == 0.7
    assert parsed.tools[0].name == "echo"  # type: ignore[union-attr]
    assert json.loads(parsed.metadata["rollgym_script"]) == SCRIPT  # type: ignore[index]


async def say_for(sdk: openai.AsyncOpenAI, rollout: str) -> str:
    script = [{"say": ["alpha", "beta", "gamma"]}]
    resp = await sdk.responses.create(
        model="scripted",
        input="pick one",
        metadata=metadata(script),
        extra_headers={"x-rollgym-rollout": rollout},
    )
    return resp.output_text


async def test_alternatives_are_deterministic_per_rollout(url: str) -> None:
    rollouts = [f"{task}:{r}" for task in range(4) for r in range(6)]
    async with client(url) as sdk:
        answers = await asyncio.gather(*(say_for(sdk, r) for r in rollouts))
        first = dict(zip(rollouts, answers, strict=True))
        again = {r: await say_for(sdk, r) for r in reversed(rollouts[:8])}
    assert again == {r: first[r] for r in again}  # a rerun gives the same answers
    assert set(first.values()) == {"alpha", "beta", "gamma"}  # repeats can differ


async def test_chat_completions_with_tools_return_tool_calls(url: str) -> None:
    tools: list[Any] = [
        {
            "type": "function",
            "function": {"name": "echo", "parameters": ECHO_TOOL["parameters"]},
        }
    ]
    async with client(url) as sdk:
        completion = await sdk.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "say v1"}],
            tools=tools,
            metadata=metadata(SCRIPT),
        )
        assert isinstance(completion, ChatCompletion)
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "echo"
        assert json.loads(call.function.arguments) == {"text": "v1"}

        messages: list[Any] = [
            {"role": "user", "content": "say v1"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"echo":"v1"}'},
        ]
        final = await sdk.chat.completions.create(
            model="scripted", messages=messages, tools=tools, metadata=metadata(SCRIPT)
        )
    ChatCompletion.model_validate(final.model_dump())
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content in ('The answer is {"echo":"v1"}', "no idea")


async def test_without_a_script_it_calls_the_first_tool_then_says_its_output(url: str) -> None:
    async with client(url) as sdk:
        first = await sdk.responses.create(model="m", input="hello", tools=[ECHO_TOOL])
        [call] = first.output
        assert call.type == "function_call" and json.loads(call.arguments) == {"text": "hello"}
        second = await sdk.responses.create(
            model="m",
            tools=[ECHO_TOOL],
            input=[
                {"role": "user", "content": "hello"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": "echo",
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "HELLO"},
            ],
        )
        assert second.output_text == "HELLO"
        plain = await sdk.responses.create(model="m", input="hello")
        assert plain.output_text == NO_SCRIPT_ANSWER


async def test_a_malformed_script_is_a_400_not_a_crash(url: str) -> None:
    async with client(url) as sdk:
        for script in ("[not json", json.dumps([{"calls": [{"arguments": {}}]}])):
            with pytest.raises(openai.BadRequestError) as info:
                await sdk.responses.create(
                    model="m", input="x", metadata={"rollgym_script": script}
                )
            assert info.value.status_code == 400
            assert "rollgym_script" in str(info.value) or "script turn" in str(info.value)
