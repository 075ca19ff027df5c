"""Fixes from review: what a model may call, abandoned work, bad answers, config guards."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from pydantic import ValidationError

from rollgym.config import RetryPolicy, parse_config
from rollgym.errors import ConfigError, ProtocolError
from rollgym.http import HttpClient, Target
from rollgym.server.resources import ResourcesServer, Session, tool
from rollgym.testing import serve_server
from tests.agents.test_tool_agent import post_run
from tests.support.stack import running_stack, task_row
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


async def test_a_model_cannot_call_verify_or_other_endpoints_as_tools() -> None:
    cheat = [
        {"call": "verify", "arguments": {"expected_answer": "x", "response": {"output": []}}},
        {"call": "seed_session", "arguments": {}},
        {"say": "The answer is v0"},
    ]
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, task_row(0, turns=cheat))
    assert status == 200, body
    outputs = [o for o in body["response"]["output"] if o["type"] == "function_call_output"]
    assert [orjson.loads(o["output"]) for o in outputs] == [
        {"error": "unknown tool 'verify'"},
        {"error": "unknown tool 'seed_session'"},
    ]
    assert stack.env.calls["verify"] == 1  # only the agent's own verify
    assert stack.env.calls["seed_session"] == 1
    assert body["reward"] == 1.0


async def test_a_malformed_task_row_is_a_422_not_a_crash() -> None:
    async with running_stack() as stack:
        status, body = await post_run(stack.agent_url, {"responses_create_params": {"input": 5}})
    assert status == 422
    assert body["error"]["type"] == "invalid_request"
    assert "responses_create_params.input" in body["error"]["message"]


class SlowTool(ResourcesServer):
    started = 0
    finished = 0
    cancelled = 0

    @tool
    async def slow(self, session: Session) -> dict[str, Any]:
        """Take a while."""
        SlowTool.started += 1
        try:
            await asyncio.sleep(2.0)
        except asyncio.CancelledError:
            SlowTool.cancelled += 1
            raise
        SlowTool.finished += 1
        return {}

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        return 0.0


async def test_every_endpoint_stops_work_when_its_caller_disconnects() -> None:
    async with serve_server(SlowTool, name="env") as (url, _), aiohttp.ClientSession() as http:
        call = asyncio.create_task(http.post(url + "/slow", json={}))
        await wait_until(lambda: SlowTool.started == 1, 30, "the tool running")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_until(lambda: SlowTool.cancelled == 1, 30, "the tool cancelled")
        assert SlowTool.finished == 0  # cancelled, it cannot finish


async def test_unknown_route_answers_the_uniform_error_body() -> None:
    async with serve_server("echo", name="env") as (url, _), aiohttp.ClientSession() as http:
        async with http.post(url + "/nope", json={}) as resp:
            assert resp.status == 404
            error = (await resp.json())["error"]
        async with http.get(url + "/verify") as resp:
            assert resp.status == 405
    assert error["server"] == "env" and error["status"] == 404 and "/nope" in error["message"]


async def test_an_answer_that_is_not_http_is_a_protocol_error_retried_when_idempotent() -> None:
    hits = 0

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal hits
        hits += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"GARBAGE NOT HTTP\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    policy = RetryPolicy(max_attempts=3, idempotent=True, backoff_initial=0.01, backoff_max=0.02)
    try:
        async with HttpClient() as client:
            with pytest.raises(ProtocolError) as info:
                await client.call(
                    Target.single("model", f"http://127.0.0.1:{port}", policy), "/x", {}
                )
    finally:
        server.close()
    assert info.value.attempts == 3 and hits == 3
    assert "not valid HTTP" in info.value.message


def test_retry_statuses_take_only_5xx() -> None:
    with pytest.raises(ValidationError, match="408/429: use retry_4xx"):
        RetryPolicy(retry_statuses=(400, 503))


@pytest.mark.parametrize(
    ("chaos", "message"),
    [
        ({"sequence": [200]}, "servers.m.chaos.sequence"),
        (
            {"faults": [{"kind": "status", "rate": 0.7}, {"kind": "delay", "rate": 0.5}]},
            "add up to 1.2",
        ),
    ],
)
def test_chaos_specs_are_checked_when_the_config_loads(chaos: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config({"servers": {"m": {"kind": "model", "impl": "scripted", "chaos": chaos}}})


@pytest.mark.parametrize(
    ("model_name", "options", "message"),
    [
        (
            "model",
            {"resources": "env", "max_stpes": 1},
            "servers.agent.options.max_stpes: unknown key",
        ),
        ("model", {"resources": "env", "max_steps": 0}, "servers.agent.options.max_steps"),
        ("llm", {"resources": "env"}, "servers.agent.options.model: no server named 'model'"),
    ],
)
async def test_server_options_are_checked_before_anything_starts(
    model_name: str, options: dict[str, Any], message: str
) -> None:
    from rollgym.launch import Supervisor

    servers = {
        model_name: {"kind": "model", "impl": "scripted"},
        "env": {"kind": "resources", "impl": "echo"},
        "agent": {"kind": "agent", "impl": "tool_agent", "options": options},
    }
    supervisor = Supervisor(parse_config({"servers": servers}, "cfg.yaml"))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")) as info:
        await supervisor.start()
    assert "cfg.yaml" in str(info.value)
    assert supervisor.pids() == []  # nothing was started


async def test_every_turns_token_data_reaches_the_verified_rollout() -> None:
    from rollgym.models.scripted import ScriptedModel
    from rollgym.server.endpoint import Call

    class TokenModel(ScriptedModel):
        """Attaches per-turn token ids, as the proxy does for a vLLM upstream."""

        turn = 0

        async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
            response = await super().respond(params, call)
            TokenModel.turn += 1
            response["rollgym_upstream"] = {"token_ids": [TokenModel.turn] * 3}
            response["usage"]["output_tokens"] = 10
            response["usage"]["total_tokens"] = response["usage"]["input_tokens"] + 10
            return response

    policy = RetryPolicy(max_attempts=1)
    async with (
        serve_server(TokenModel, name="model") as (model_url, _),
        serve_server("echo", name="env") as (env_url, _),
        serve_server(
            "tool_agent",
            name="agent",
            options={"model": "model", "resources": "env"},
            peers={
                "model": Target.single("model", model_url, policy),
                "env": Target.single("env", env_url, policy),
            },
        ) as (agent_url, _),
    ):
        status, body = await post_run(agent_url, task_row(0))
    assert status == 200, body
    response = body["response"]
    # Each call's entry, with the policy version and replica the model server adds to it.
    stamp = {"rollgym_policy_version": 0, "rollgym_replica": 0}
    assert response["rollgym_upstream"] == [
        {"token_ids": [1, 1, 1], **stamp},
        {"token_ids": [2, 2, 2], **stamp},
    ]
    assert response["usage"]["output_tokens"] == 20  # both turns, not the last one only
