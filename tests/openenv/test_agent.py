"""rollgym's ``openenv_agent`` on openenv-core 0.3.0's real server (``create_app``) with its example
echo environment (``openenv init``'s template), on 127.0.0.1: rewards as the environment gives
them, a dropped socket before and after a step, a full server, a crashing and a hung step, and
hostile model output. The model is rollgym's scripted stand-in (not a language model)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollgym.errors import RollgymError
from rollgym.testing import serve_asgi

from .support import (
    RELEASE,
    acts,
    agent_stack,
    echo_app,
    echo_rewards,
    faulty_echo,
    relay,
    script_row,
    serve_aiohttp,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _echo(echo_env_root: Path) -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()  # a hung step's thread returns


def origin(body: dict[str, Any]) -> RollgymError:
    """The error the agent's 502/504 body carries: the OpenEnv server's own failure."""
    err = RollgymError.from_dict(body["error"])
    assert err.origin is not None, body
    return err.origin


async def test_rewards_are_the_environments_own_summed_per_step() -> None:
    messages = ["hello", "hi there", "x"]
    async with agent_stack(echo_app()) as stack:
        status, body = await stack.run(script_row(acts(*messages), task_index=0))
    assert status == 200, body
    expected = echo_rewards(messages)  # the environment played in-process, without rollgym
    assert body["step_rewards"] == expected
    assert body["reward"] == sum(expected)
    assert (body["env_steps"], body["num_steps"]) == (3, 4)
    assert body["observation"] == {"echoed_message": "x", "message_length": 1}
    assert (body["terminated"], body["truncated"], body["session_attempts"]) == (False, False, 1)
    # The model was offered the environment's action schema (GET /schema) as the "act" tool.
    (tool,) = body["responses_create_params"]["tools"]
    assert tool["name"] == "act" and tool["parameters"]["required"] == ["message"]
    assert "metadata" not in tool["parameters"]["properties"]
    outputs = [i for i in body["response"]["output"] if i["type"] == "function_call_output"]
    assert '"echoed_message":"hi there"' in outputs[1]["output"]


async def test_max_steps_truncates_and_text_action_steps_with_the_models_text() -> None:
    async with agent_stack(echo_app(), max_steps=2) as stack:
        status, body = await stack.run(script_row(acts("a", "bb", "ccc")))
    assert status == 200, body
    assert body["step_rewards"] == echo_rewards(["a", "bb"]) and body["truncated"] is True
    async with agent_stack(echo_app(), max_steps=2, text_action="message") as stack:
        status, body = await stack.run(script_row([{"say": "four"}, {"say": "sixsix"}]))
    assert status == 200, body
    assert body["step_rewards"] == echo_rewards(["four", "sixsix"])
    assert "tools" not in body["responses_create_params"]


async def test_hostile_actions_are_refused_to_the_model_and_never_applied() -> None:
    script = [
        {"call": "act", "arguments": {"msg": "wrong field"}},  # the environment refuses it
        {"call": "act", "arguments": {"message": "ok", "extra": 1}},  # extra=forbid there
        {"call": "verify", "arguments": {"message": "x"}},  # not the action tool
        {"call": "act", "arguments": {"message": "real"}},
        {"say": "done"},
    ]
    async with agent_stack(echo_app()) as stack:
        status, body = await stack.run(script_row(script))
    assert status == 200, body
    assert body["step_rewards"] == echo_rewards(["real"]) and body["env_steps"] == 1
    outputs = [i["output"] for i in body["response"]["output"] if i["type"].endswith("_output")]
    assert "invalid action" in outputs[0] and "invalid action" in outputs[1]
    assert "unknown tool 'verify'" in outputs[2]
    assert "real" in outputs[3]


async def test_a_row_whose_reset_is_not_an_object_is_refused() -> None:
    async with agent_stack(echo_app()) as stack:
        status, body = await stack.run(script_row(acts("x"), openenv_reset=["seed", 1]))
    assert status == 422 and "openenv_reset" in body["error"]["message"], body


async def test_a_socket_dropped_before_the_first_step_reconnects_to_a_new_session() -> None:
    messages = ["one", "two"]
    async with (
        serve_asgi(echo_app()) as url,
        relay(url, drop_connection=0, drop_answer=1) as (
            r,
            front,
        ),
        agent_stack(env_url=front) as stack,
    ):
        status, body = await stack.run(script_row(acts(*messages)))
    assert status == 200, body
    assert r.dropped == 1 and r.connections == 2
    assert body["session_attempts"] == 2
    assert body["rollgym_timing"]["retries"] == {"seed": 1}  # in the report's retry counts
    assert body["step_rewards"] == echo_rewards(messages)  # a fresh episode, played whole


async def test_a_socket_dropped_after_a_step_fails_the_rollout_and_says_why() -> None:
    async with (
        serve_asgi(echo_app()) as url,
        relay(url, drop_connection=0, drop_answer=2) as (
            r,
            front,
        ),
        agent_stack(env_url=front) as stack,
    ):
        status, body = await stack.run(script_row(acts("applied?", "never sent")))
    assert status == 502, body
    assert r.connections == 1  # no reconnect: the step may have been applied
    err = origin(body)
    assert (err.type, err.server, err.endpoint) == ("connection_lost", "echo", "/step")
    assert "may have been applied" in err.message
    assert err.retryable  # the whole rollout may run again, on a new session


async def test_a_full_server_is_capacity_reached_after_the_policys_attempts() -> None:
    from openenv.core import GenericEnvClient

    retry = {"max_attempts": 2}
    async with agent_stack(echo_app(max_concurrent_envs=1), retry=retry) as stack:
        holder = GenericEnvClient(base_url=stack.env_url, message_timeout_s=10)
        async with holder:  # OpenEnv's own client holds the only session
            await holder.reset()
            status, body = await stack.run(script_row(acts("x")))
        assert status == 502, body
        err = origin(body)
        assert (err.type, err.status, err.server, err.attempts) == (
            "capacity_reached",
            503,
            "echo",
            2,
        )
        assert "1 of 1 sessions" in err.message and err.retryable
        # The session freed, the same agent gets one. OpenEnv's client closes without waiting
        # for the server to destroy its session, so the slot frees a moment later: asked
        # again for at most 10 s, and meanwhile only ever refused as full.
        async with asyncio.timeout(10):
            while True:
                status, body = await stack.run(script_row(acts("x")))
                if status == 200:
                    break
                assert origin(body).type == "capacity_reached", body
                await asyncio.sleep(0.05)


async def test_a_full_replica_sends_the_session_to_another() -> None:
    from openenv.core import GenericEnvClient

    async with serve_asgi(echo_app(max_concurrent_envs=1)) as second:
        app = echo_app(max_concurrent_envs=1)
        async with (
            agent_stack(app, replicas=(second,), retry={"max_attempts": 2}) as stack,
            GenericEnvClient(base_url=stack.env_url, message_timeout_s=10) as holder,
        ):
            await holder.reset()  # the first replica is full
            # Rollouts 0:0 and 2:0 try the second replica first, 1:0 and 3:0 the full one.
            for i in range(4):
                row = script_row(acts("abc"), task_index=i, rollout_index=0)
                status, body = await stack.run(row)
                assert status == 200, body
                assert body["step_rewards"] == echo_rewards(["abc"])
                assert body["session_attempts"] == (2 if i % 2 else 1)


async def test_max_sessions_queues_rollouts_instead_of_overfilling_the_server() -> None:
    rows = [script_row(acts("a" * (i + 1)), task_index=i) for i in range(4)]
    retry = {"max_attempts": 1}  # a refusal would fail at once: none may happen
    async with agent_stack(echo_app(max_concurrent_envs=1), retry=retry, max_sessions=1) as stack:
        answers = await asyncio.gather(*(stack.run(row) for row in rows))
    assert [status for status, _ in answers] == [200] * 4, answers
    assert [body["reward"] for _, body in answers] == [
        echo_rewards(["a" * (i + 1)])[0] for i in range(4)
    ]


async def test_concurrent_rollouts_never_share_a_session() -> None:
    # "count" is rewarded with the steps of its own session: shared sessions would count higher.
    rows = [script_row(acts("count", "count", "count"), task_index=i) for i in range(6)]
    async with agent_stack(echo_app(max_concurrent_envs=6, env=faulty_echo())) as stack:
        answers = await asyncio.gather(*(stack.run(row) for row in rows))
    assert [body.get("step_rewards") for _, body in answers] == [[1.0, 2.0, 3.0]] * 6, answers


async def test_a_crashing_step_is_the_environment_servers_failure() -> None:
    async with agent_stack(echo_app(env=faulty_echo())) as stack:
        status, body = await stack.run(script_row(acts("fine", "boom")))
    assert status == 502, body
    err = origin(body)
    assert (err.type, err.status, err.server, err.endpoint) == ("http_status", 500, "echo", "/step")
    assert "EXECUTION_ERROR" in err.message and "broke on purpose" in err.message
    assert body["error"]["server"] == "agent"  # the agent is only the gateway


async def test_a_hung_step_times_out_under_the_step_deadline() -> None:
    retry = {"endpoints": {"/step": {"attempt_timeout": 0.5}}}
    async with agent_stack(echo_app(env=faulty_echo()), retry=retry) as stack:
        status, body = await stack.run(script_row(acts("hang")))
        RELEASE.set()  # the server's thread returns, so it can stop
    assert status == 504, body
    err = origin(body)
    assert (err.type, err.server, err.endpoint) == ("read_timeout", "echo", "/step")


async def test_a_server_that_is_not_there_is_a_connect_error_after_its_attempts(
    dead_url: Callable[[], str],
) -> None:
    async with agent_stack(env_url=dead_url(), retry={"max_attempts": 2}) as stack:
        status, body = await stack.run(script_row(acts("x")))
    assert status == 502, body
    err = origin(body)
    assert err.type in ("connect_error", "connection_lost") and err.server == "echo", err


async def test_many_calls_in_one_turn_take_at_most_max_steps_steps() -> None:
    """A model that puts 50 act calls in one turn: max_steps bounds the environment's steps
    too (it bounded turns only, and a model earned 2,000 with max_steps 1)."""
    calls = [{"name": "act", "arguments": {"message": "count"}} for _ in range(50)]
    async with agent_stack(echo_app(env=faulty_echo()), max_steps=2) as stack:
        status, body = await stack.run(script_row([{"calls": calls}, {"calls": calls}]))
    assert status == 200, body
    assert body["env_steps"] == 2 and body["step_rewards"] == [1.0, 2.0]
    assert body["reward"] == 3.0 and body["truncated"] is True
    outputs = [i["output"] for i in body["response"]["output"] if i["type"].endswith("_output")]
    assert len(outputs) == 50  # every call answered, 48 of them without a step
    assert sum("step budget (max_steps 2) is spent" in o for o in outputs) == 48


async def test_rewards_that_sum_past_a_float_are_the_servers_protocol_error() -> None:
    async with agent_stack(echo_app(env=faulty_echo())) as stack:
        status, body = await stack.run(script_row(acts("huge", "huge")))
    assert status == 502, body
    err = origin(body)
    assert (err.type, err.server, err.endpoint) == ("protocol_error", "echo", "/step")
    assert "not a finite number" in err.message


async def test_a_server_that_pings_and_never_answers_times_out() -> None:
    """aiohttp's receive timeout starts again after each ping it answers: the answer's
    deadline must hold across them."""
    from aiohttp import web

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse(autoping=True)
        await sock.prepare(request)
        await sock.receive()  # the reset
        while not sock.closed:
            await sock.ping()
            await asyncio.sleep(0.05)
        return sock

    app = web.Application()
    app.router.add_get("/ws", ws)
    async with serve_aiohttp(app) as url:
        retry = {"max_attempts": 1, "endpoints": {"/reset": {"attempt_timeout": 0.5}}}
        async with agent_stack(env_url=url, retry=retry, text_action="message") as stack:
            status, body = await stack.run(script_row([{"say": "x"}]))
    assert status == 504, body
    err = origin(body)
    assert (err.type, err.server, err.endpoint) == ("read_timeout", "echo", "/reset")


async def test_a_schema_past_the_answer_limit_is_refused_unread() -> None:
    from aiohttp import web

    async def schema(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(64):  # 4 MiB, more than the 1 MiB limit below
            await resp.write(b" " * 65536)
        return resp

    app = web.Application()
    app.router.add_get("/schema", schema)
    async with serve_aiohttp(app) as url:
        retry = {"answer_limits": {"body_bytes": 1 << 20}}
        async with agent_stack(env_url=url, retry=retry) as stack:
            status, body = await stack.run(script_row(acts("x")))
    assert status == 502, body
    err = origin(body)
    assert (err.type, err.server, err.endpoint) == ("answer_too_large", "echo", "/schema")
