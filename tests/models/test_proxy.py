"""The OpenAI proxy served for real, called with the real ``openai`` SDK, in front of a small
upstream written for the test (also served for real on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollgym.config import ServerConfig
from rollgym.errors import ConfigError
from rollgym.models.proxy import OpenAIProxy
from rollgym.server.base import BaseServer, ServerContext
from rollgym.testing import serve_asgi, serve_server

from .shapes import check_chat_request, check_response

pytestmark = pytest.mark.timeout(20)

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.02}
KEY_ENV = "ROLLGYM_TEST_UPSTREAM_KEY"
# Deliberately not shaped like "sk-...": only the proxy itself knows to mask it when echoed bare.
SECRET = "plain-secret-7f3a9c1e5b2d"

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class FakeUpstream:
    """A chat completions server like vLLM: echoes the last message, calls the first tool when
    tools are offered and no tool has answered yet, fails on demand, records what it got."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.fail_next: list[int] = []  # statuses for the next requests, in order
        self.fail_always: int | None = None
        self.echo_in_error = (
            "header"  # what a failure echoes: the Authorization "header" or bare "key"
        )
        self.answer_override: Any = None  # a 200 body to send instead of a completion
        self.plain = False  # answer whole JSON even when asked to stream (an upstream that can't)
        self.reasoning: str | None = None
        self.delay = 0.0
        self.url = ""
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.delay:
            await asyncio.sleep(self.delay)
        status = self.fail_next.pop(0) if self.fail_next else self.fail_always
        if status:
            auth = request.headers.get("authorization", "")
            echoed = auth if self.echo_in_error == "header" else auth.removeprefix("Bearer ")
            return JSONResponse(
                {"error": {"message": f"worker crashed; you sent {echoed}", "got": echoed}},
                status_code=status,
            )
        if self.answer_override is not None:
            return JSONResponse(self.answer_override)
        if body.get("stream") and not self.plain:
            usage = (body.get("stream_options") or {}).get("include_usage", False)
            chunks = vllm_chunks(self._completion(body), usage)
            data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return Response(data, media_type="text/event-stream")
        return JSONResponse(self._completion(body))

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        tools = body.get("tools") or []
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if tools and not any(m["role"] == "tool" for m in messages):
            user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
            message["tool_calls"] = [
                {
                    "id": f"call_{len(self.requests)}",
                    "type": "function",
                    "function": {
                        "name": tools[0]["function"]["name"],
                        "arguments": json.dumps({"city": user.split()[-1].strip("?")}),
                    },
                }
            ]
            finish = "tool_calls"
        else:
            message["content"] = f"echo: {messages[-1]['content']}"
            finish = "stop"
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "fake-model"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": None,
                    "token_ids": [11, 12, 13],
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
            "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7],
        }


def vllm_chunks(completion: dict[str, Any], usage: bool) -> list[dict[str, Any]]:
    """``completion`` streamed the way vLLM streams (a few characters and one token id per
    chunk, ``prompt_token_ids`` on the first, usage last), written out here independently of
    the proxy's own code."""
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    [choice] = completion["choices"]
    message = choice["message"]

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": None, **extra}]}  # fmt: skip

    out = [{**chunk({"role": "assistant", "content": ""}),
            "prompt_token_ids": completion["prompt_token_ids"]}]  # fmt: skip
    for i in range(0, len(message.get("reasoning_content") or ""), 5):
        out.append(chunk({"reasoning_content": message["reasoning_content"][i : i + 5]}))
    text = message.get("content") or ""
    ids = list(choice["token_ids"])

    def take() -> list[int]:
        first = ids[:1]
        del ids[:1]
        return first

    for i in range(0, len(text), 4):
        out.append(chunk({"content": text[i : i + 4]}, token_ids=take()))
    for n, call in enumerate(message.get("tool_calls") or []):
        args = call["function"]["arguments"]
        out.append(chunk({"tool_calls": [{"index": n, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"]}}]}))  # fmt: skip
        for i in range(0, len(args), 3):
            piece = {"index": n, "function": {"arguments": args[i : i + 3]}}
            out.append(chunk({"tool_calls": [piece]}, token_ids=take()))
    out.append(chunk({}, finish_reason=choice["finish_reason"], token_ids=ids))
    if usage:
        out.append({**head, "choices": [], "usage": completion["usage"]})
    return out


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    async with serve_asgi(fake.app) as url:
        fake.url = url
        yield fake


@asynccontextmanager
async def proxy(upstream: FakeUpstream, **options: Any) -> AsyncIterator[tuple[str, BaseServer]]:
    opts = {"base_url": f"{upstream.url}/v1", "upstream_retry": FAST_RETRY, **options}
    async with serve_server("openai_proxy", name="model", options=opts) as served:
        yield served


def sdk(url: str, api_key: str = "client-side-key") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=10)


async def test_responses_create_through_the_sdk(upstream: FakeUpstream) -> None:
    upstream.reasoning = "The user said hello."
    async with proxy(upstream, model="served-model") as (url, _), sdk(url) as client:
        raw = await client.responses.with_raw_response.create(
            model="whatever",
            instructions="Be brief.",
            input="hello there",
            temperature=0.2,
            max_output_tokens=16,
        )
        data = raw.http_response.json()
        response = raw.parse()
    assert response.output_text == "echo: hello there"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    check_response(data)
    assert data["model"] == "served-model"
    assert data["usage"]["input_tokens"] == 7 and data["usage"]["output_tokens"] == 3
    assert data["rollgym_upstream"]["prompt_token_ids"] == [1, 2, 3, 4, 5, 6, 7]
    assert data["rollgym_upstream"]["token_ids"] == [11, 12, 13]
    [sent] = upstream.requests
    assert sent == {
        "model": "served-model",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello there"},
        ],
        "temperature": 0.2,
        "max_tokens": 16,
        # Asked for whole: what the upstream answers whole is what the proxy hands on.
    }
    check_chat_request(sent)


async def test_tool_call_round_trip(upstream: FakeUpstream) -> None:
    upstream.reasoning = "Need the weather tool."
    async with proxy(upstream) as (url, _), sdk(url) as client:
        question = {"role": "user", "content": "What is the weather in Oslo?"}
        first = await client.responses.create(
            model="m", input=[question], tools=[WEATHER_TOOL], tool_choice="auto"
        )
        calls = [item for item in first.output if item.type == "function_call"]
        assert len(calls) == 1
        call = calls[0]
        assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
        # The usual client loop: send back everything the model produced plus the tool output.
        second = await client.responses.create(
            model="m",
            input=[
                question,
                *first.output,
                {"type": "function_call_output", "call_id": call.call_id, "output": "-3 C, snow"},
            ],
            tools=[WEATHER_TOOL],
        )
    assert second.output_text == "echo: -3 C, snow"
    assert [item.type for item in second.output] == ["reasoning", "message"]
    first_sent, second_sent = upstream.requests
    assert first_sent["tools"] == [
        {
            "type": "function",
            "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"},
        }
    ]
    assert first_sent["tool_choice"] == "auto"
    assert second_sent["messages"] == [
        question,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need the weather tool.",
            "reasoning": "Need the weather tool.",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "-3 C, snow"},
    ]
    check_chat_request(first_sent)
    check_chat_request(second_sent)


async def test_chat_completions_pass_through(upstream: FakeUpstream) -> None:
    async with (
        proxy(upstream, model="served-model", extra_body={"return_token_ids": True}) as (url, _),
        sdk(url) as client,
    ):
        completion = await client.chat.completions.create(
            model="asked-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert completion.choices[0].message.content == "echo: hi"
    assert completion.model == "served-model"
    # vLLM's token fields survive the pass-through untouched.
    assert completion.model_extra is not None
    assert completion.model_extra["prompt_token_ids"] == [1, 2, 3, 4, 5, 6, 7]
    [sent] = upstream.requests
    assert sent == {
        "model": "served-model",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "return_token_ids": True,
    }


async def test_upstream_503_twice_then_200_succeeds(upstream: FakeUpstream) -> None:
    upstream.fail_next = [503, 503]
    async with proxy(upstream) as (url, _), sdk(url) as client:
        response = await client.responses.create(model="m", input="again")
    assert response.output_text == "echo: again"
    assert len(upstream.requests) == 3


async def test_upstream_always_500_is_a_502_naming_the_upstream(upstream: FakeUpstream) -> None:
    upstream.fail_always = 500
    async with proxy(upstream) as (url, _), sdk(url) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.responses.create(model="m", input="boom")
    assert info.value.status_code == 502
    error = info.value.response.json()["error"]
    assert error["type"] == "upstream_error" and error["server"] == "model"
    origin = error["origin"]
    assert origin["type"] == "http_status"
    assert origin["status"] == 500
    assert origin["server"] == "model.upstream"
    assert origin["endpoint"] == "/chat/completions"
    assert origin["attempts"] == 3
    assert len(upstream.requests) == 3


async def test_chat_pass_through_failure_is_a_502_too(upstream: FakeUpstream) -> None:
    upstream.fail_always = 503
    options = {"upstream_retry": {**FAST_RETRY, "max_attempts": 2}}
    async with proxy(upstream, **options) as (url, _), sdk(url) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
    assert info.value.status_code == 502
    origin = info.value.response.json()["error"]["origin"]
    assert (origin["status"], origin["server"], origin["attempts"]) == (503, "model.upstream", 2)


async def test_malformed_upstream_answer_is_a_protocol_error(upstream: FakeUpstream) -> None:
    upstream.answer_override = {"object": "chat.completion", "choices": []}
    async with proxy(upstream) as (url, _), sdk(url) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.responses.create(model="m", input="x")
    assert info.value.status_code == 502
    origin = info.value.response.json()["error"]["origin"]
    assert origin["type"] == "protocol_error"
    assert origin["server"] == "model.upstream"
    assert "choices" in origin["message"]


async def test_upstream_timeout_is_a_504(upstream: FakeUpstream) -> None:
    upstream.delay = 1.0
    options = {"timeout": 0.1, "upstream_retry": {**FAST_RETRY, "max_attempts": 2}}
    async with proxy(upstream, **options) as (url, _), sdk(url) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.responses.create(model="m", input="slow")
    assert info.value.status_code == 504
    origin = info.value.response.json()["error"]["origin"]
    assert (origin["type"], origin["server"], origin["attempts"]) == (
        "read_timeout",
        "model.upstream",
        2,
    )


async def test_unreachable_upstream_is_a_502_connect_error(dead_url: Callable[[], str]) -> None:
    options = {"base_url": dead_url() + "/v1", "upstream_retry": FAST_RETRY}
    served = serve_server("openai_proxy", name="model", options=options)
    async with served as (url, _), sdk(url) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.responses.create(model="m", input="x")
    assert info.value.status_code == 502
    origin = info.value.response.json()["error"]["origin"]
    assert (origin["type"], origin["server"], origin["attempts"]) == (
        "connect_error",
        "model.upstream",
        3,
    )


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/responses", b"{not json", 400),
        ("/v1/responses", b"[1, 2]", 422),
        ("/v1/responses", b'{"input": [{"type": "item_reference", "id": "x"}]}', 422),
    ],
)
async def test_bad_requests_are_4xx_and_never_reach_the_upstream(
    upstream: FakeUpstream, path: str, body: bytes, status: int
) -> None:
    headers = {"content-type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        proxy(upstream) as (url, _),
        aiohttp.ClientSession() as http,
        http.post(url + path, data=body, headers=headers, timeout=timeout) as answer,
    ):
        assert answer.status == status
        error = (await answer.json())["error"]
    assert error["type"] == "invalid_request" and error["server"] == "model"
    assert upstream.requests == []


@pytest.mark.parametrize("echo", ["header", "key"])
async def test_api_key_reaches_the_upstream_and_nowhere_else(
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    echo: str,
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    caplog.set_level(logging.WARNING)
    async with proxy(upstream, api_key_env=KEY_ENV) as (url, server), sdk(url) as client:
        await client.responses.create(model="m", input="first")
        upstream.fail_always = 500
        upstream.echo_in_error = echo
        with pytest.raises(openai.APIStatusError) as info:
            await client.responses.create(model="m", input="second")
        assert SECRET not in repr(vars(server))  # nothing in the server's public state shows it
    # Only the proxy's own key goes upstream; the SDK's key to the proxy is not forwarded.
    assert {h["authorization"] for h in upstream.headers} == {f"Bearer {SECRET}"}
    text = info.value.response.text
    assert info.value.status_code == 502
    assert "worker crashed" in text  # the upstream's error did come through...
    assert SECRET not in text  # ...without the key
    assert SECRET not in caplog.text
    assert any("worker crashed" in r.getMessage() for r in caplog.records)


async def test_api_key_never_reaches_debug_logs(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The upstream echoes the Authorization header (the realistic leak) at every attempt."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    caplog.set_level(logging.DEBUG)
    upstream.fail_always = 500
    async with proxy(upstream, api_key_env=KEY_ENV) as (url, _), sdk(url) as client:
        with pytest.raises(openai.APIStatusError):
            await client.responses.create(model="m", input="x")
    assert len(upstream.requests) == 3
    assert "retrying" in caplog.text  # the retries were logged...
    assert SECRET not in caplog.text  # ...without the key


async def test_bare_key_echo_never_reaches_debug_logs(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    caplog.set_level(logging.DEBUG)
    upstream.fail_always = 500
    upstream.echo_in_error = "key"
    async with proxy(upstream, api_key_env=KEY_ENV) as (url, _), sdk(url) as client:
        with pytest.raises(openai.APIStatusError):
            await client.responses.create(model="m", input="x")
    assert SECRET not in caplog.text


def make_proxy(**options: Any) -> OpenAIProxy:
    config = ServerConfig(kind="model", impl="openai_proxy", options=options)
    return OpenAIProxy(ServerContext(name="model", config=config))


def test_upstream_policy_defaults_to_model_server_retries() -> None:
    server = make_proxy(base_url="http://upstream:8000/v1/", timeout=30)
    [replica] = server.replicas.all
    policy = replica.chat.policy
    assert replica.chat.name == "model.upstream"
    assert replica.chat.urls == ("http://upstream:8000/v1",)
    assert (replica.root.name, replica.root.urls) == (
        "model.upstream_root",
        ("http://upstream:8000",),
    )
    assert (policy.idempotent, policy.max_attempts, policy.attempt_timeout) == (True, 3, 30)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({}, "base_url"),
        ({"base_url": "upstream:8000"}, "base_url"),
        (
            {"base_url": "http://u/v1", "base_ur1": "x"},
            "servers.model.options.base_ur1: unknown key",
        ),
        ({"base_url": "http://u/v1", "upstream_retry": {"max_attempts": 0}}, "max_attempts"),
        ({"base_url": "http://u/v1", "upstream_retry": {"retrys": 2}}, "unknown key"),
        ({"base_url": "http://u/v1", "timeout": -1}, "timeout"),
        ({"base_url": "http://u/v1", "api_key_env": "ROLLGYM_TEST_UNSET_VAR"}, "is not set"),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_proxy(**options)
    assert needle in info.value.message
    assert "servers.model.options" in info.value.message
