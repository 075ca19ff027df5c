"""NeMo Gym 0.7's ``/ng-rollout/<id>/`` path prefix on every rollgym server, in-process and over
a real socket: ``/ng-rollout/<id>/<rest>`` is served as ``/<rest>`` with ``<id>`` as the call's
rollout id (when no ``x-rollgym-rollout`` header names one); model and agent servers also take
``/ng-rollout/<id>/training-token-capture/<rest>``, which asks for training token ids (the
proxy attaches them as ``return_token_ids`` does). An ``<id>`` that is not 0.7's is a 404."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.responses import Response

from rollgym.agents.tool_agent import ToolAgent
from rollgym.envs.echo.server import EchoEnv
from rollgym.http import Target
from rollgym.models.proxy import OpenAIProxy
from rollgym.server.app import MAX_ROLLOUT_ID_CHARS
from rollgym.server.endpoint import Call
from rollgym.server.model import ModelServer
from rollgym.testing import serve_asgi
from rollgym.wire import HEADER_ROLLOUT, SCOPE_ROLLOUT, SESSION_COOKIE
from tests.envs.env_client import reply
from tests.models.vllm_double import VllmDouble
from tests.support.asgi import TRANSPORTS, Client, asgi_request, build, client
from tests.support.stack import fast_policy, running_stack, task_row

pytestmark = pytest.mark.timeout(60)

TRAINING = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
ROW = {"responses_create_params": {"input": "x"}, "expected_answer": "v1"}


class Probe(ModelServer):
    """Answers what the call said of itself: its rollout id and whether it asked for tokens.
    Keeps the scope of every call it served in ``scopes``."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.scopes: list[dict[str, Any]] = []

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        self.scopes.append(call.request.scope)
        return {"rollout": call.rollout, "token_capture": call.token_capture}


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def env(transport: str) -> AsyncIterator[Client]:
    async with client(transport, build(EchoEnv, "env")) as c:
        yield c


@pytest.fixture
async def model(transport: str) -> AsyncIterator[Client]:
    async with client(transport, build(Probe, "model")) as c:
        yield c


# -- resources servers ------------------------------------------------------------------------


async def test_a_prefixed_path_is_served_as_the_path_without_it(env: Client) -> None:
    body = {**ROW, "response": reply("v1")}
    plain = await env.post("/verify", body)
    prefixed = await env.post("/ng-rollout/probe-1/verify", body)
    assert prefixed.status == plain.status == 200
    assert prefixed.body == plain.body and prefixed.body["reward"] == 1.0
    mode = await env.get("/ng-rollout/probe-1/reverify_mode")
    assert mode.status == 200 and mode.body == (await env.get("/reverify_mode")).body
    assert (await env.get("/ng-rollout/a.b_c-9/health")).body["status"] == "ok"


async def test_a_whole_0_7_session_runs_under_the_prefix(env: Client) -> None:
    seed = {
        "resources_session_id": "rs-1",
        "episode_id": {"rollout_id": "3-1", "attempt": 0},
        "task_id": {"taskset": "echo:test", "task_id": "t3"},
        "task_data": {"expected_answer": "v1"},
    }
    seeded = await env.post("/ng-rollout/3-1/seed_session", seed)
    assert seeded.status == 200 and SESSION_COOKIE in seeded.cookies
    echoed = await env.post("/ng-rollout/3-1/echo", {"text": "v1"}, cookies=seeded.cookies)
    assert echoed.status == 200
    body = {"expected_answer": "v1", "responses_create_params": {"input": "x"}}
    verified = await env.post(
        "/ng-rollout/3-1/verify", {**body, "response": reply("v1")}, cookies=seeded.cookies
    )
    assert verified.body["reward"] == 1.0
    close = {"resources_session_id": "rs-1", "episode_id": seed["episode_id"]}
    closed = await env.post("/ng-rollout/3-1/close_session", close)
    assert (closed.status, closed.body) == (200, {"resources_session_id": "rs-1"})


@pytest.mark.parametrize(
    "path",
    [
        "/ng-rollout/../verify",
        "/ng-rollout/./verify",
        "/ng-rollout/.hidden/verify",
        "/ng-rollout/-x/verify",
        "/ng-rollout//verify",
        "/ng-rollout/a%20b/verify",
        "/ng-rollout/a%0A/verify",
        "/ng-rollout/a%00/verify",
        "/ng-rollout/%C3%A9/verify",
        "/ng-rollout/" + "a" * (MAX_ROLLOUT_ID_CHARS + 1) + "/verify",
        "/ng-rollout/" + "a" * 10_240 + "/verify",
        "/ng-rollout/probe-1",
    ],
    ids=[
        "dotdot", "dot", "leading-dot", "leading-dash", "empty", "space", "newline", "nul",
        "non-ascii", "one-too-long", "10KB", "no-rest",
    ],
)  # fmt: skip
async def test_an_id_that_is_not_0_7s_is_a_404_with_rollgyms_error_body(
    env: Client, path: str
) -> None:
    answer = await env.post(path, {**ROW, "response": reply("v1")})
    assert answer.status == 404, answer.body
    error = answer.body["error"]
    assert error["status"] == 404 and error["server"] == "env"
    assert "/ng-rollout/<id>/" in error["message"] and len(error["message"]) < 600


@pytest.mark.parametrize(
    "path",
    [
        "/ng-rollout/a%2Fb/verify",  # an escaped slash is a slash: id "a", then /b/verify
        "/ng-rollout/a/b/verify",
        "/ng-rollout/a/ng-rollout/b/verify",  # one prefix only
        "/ng-rollout/a/training-token-capture/verify",  # not on a resources server (as 0.7)
        "/ng-rollout/a/verify/",
        "/ng-rolloutx/a/verify",
    ],
    ids=["escaped-slash", "two-segments", "two-prefixes", "token-capture", "slash", "near-miss"],
)
async def test_a_valid_prefix_before_no_endpoint_is_the_usual_404(env: Client, path: str) -> None:
    answer = await env.post(path, {**ROW, "response": reply("v1")})
    assert answer.status == 404, answer.body
    assert answer.body["error"]["status"] == 404


async def test_the_longest_id_taken_is_served(env: Client) -> None:
    longest = "a" * MAX_ROLLOUT_ID_CHARS
    answer = await env.post(f"/ng-rollout/{longest}/verify", {**ROW, "response": reply("v1")})
    assert answer.status == 200 and answer.body["reward"] == 1.0


# -- model servers ----------------------------------------------------------------------------


async def test_the_prefix_names_the_rollout_unless_the_header_does(model: Client) -> None:
    params = {"input": "hi"}
    plain = await model.post("/v1/responses", params)
    # Every model server's answer records its call's policy version (here the only addition).
    stamp = {"rollgym_upstream": {"rollgym_policy_version": 0, "rollgym_replica": None}}
    assert plain.body == {"rollout": None, "token_capture": False, **stamp}
    prefixed = await model.post("/ng-rollout/7-2-a1/v1/responses", params)
    assert prefixed.body == {"rollout": "7-2-a1", "token_capture": False, **stamp}
    header = await model.post("/ng-rollout/7-2/v1/responses", params, headers={HEADER_ROLLOUT: "h"})
    assert header.body == {"rollout": "h", "token_capture": False, **stamp}
    capture = await model.post("/ng-rollout/7-2/training-token-capture/v1/responses", params)
    assert capture.body == {"rollout": "7-2", "token_capture": True, **stamp}
    # The segment without a rest names no endpoint; after the rest it is part of the path.
    assert (await model.post("/ng-rollout/7-2/training-token-capture", params)).status == 404
    odd = await model.post("/ng-rollout/7-2/v1/training-token-capture/responses", params)
    assert odd.status == 404
    # The segment alone, without the prefix, is no prefix.
    assert (await model.post("/training-token-capture/v1/responses", params)).status == 404


async def test_an_ordinary_path_is_served_with_the_callers_own_scope() -> None:
    """The prefix costs ordinary paths nothing: their scope reaches the endpoint as sent (no
    copy, nothing added); a prefixed one is served from a copy."""
    app = build(Probe, "model")
    sent: list[dict[str, Any]] = []
    await asgi_request(app, "POST", "/v1/responses", b"{}", scopes=sent)
    await asgi_request(app, "POST", "/ng-rollout/r/v1/responses", b"{}", scopes=sent)
    served = app.server.scopes
    assert served[0] is sent[0] and SCOPE_ROLLOUT not in sent[0]
    assert served[1] is not sent[1] and sent[1]["path"] == "/ng-rollout/r/v1/responses"
    assert (served[1]["path"], served[1]["raw_path"]) == ("/v1/responses", b"/v1/responses")


async def test_scripted_model_answers_the_same_under_every_form(transport: str) -> None:
    from rollgym.models.scripted import ScriptedModel

    params = {
        "input": "hi",
        "metadata": {"rollgym_script": '[{"say": ["a", "b", "c", "d", "e", "f", "g", "h"]}]'},
    }

    def said(answer: Any) -> str:
        return str(answer.body["output"][-1]["content"][0]["text"])

    async with client(transport, build(ScriptedModel, "model")) as c:
        by_header = [
            said(await c.post("/v1/responses", params, headers={HEADER_ROLLOUT: f"r{i}"}))
            for i in range(8)
        ]
        by_prefix = [said(await c.post(f"/ng-rollout/r{i}/v1/responses", params)) for i in range(8)]
        captured = [
            said(await c.post(f"/ng-rollout/r{i}/training-token-capture/v1/responses", params))
            for i in range(8)
        ]
        chat = await c.post(
            "/ng-rollout/r0/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}
        )
    assert by_prefix == by_header == captured
    assert len(set(by_header)) > 1  # the id really picks the answer
    assert chat.status == 200


async def test_token_capture_asks_the_proxy_for_this_calls_token_ids(transport: str) -> None:
    upstream = VllmDouble()
    async with serve_asgi(upstream.app) as up_url:
        options = {"base_url": up_url + "/v1", "model": "toy", "return_token_ids": False}
        async with client(transport, build(OpenAIProxy, "model", options)) as c:
            params = {"input": "please answer v3"}
            plain = await c.post("/ng-rollout/r1/v1/responses", params)
            capture = await c.post("/ng-rollout/r1/training-token-capture/v1/responses", params)
    assert plain.status == capture.status == 200, (plain.body, capture.body)
    assert not any(k in plain.body["output"][-1] for k in TRAINING)
    last = capture.body["output"][-1]
    assert all(k in last for k in TRAINING)
    assert last["generation_token_ids"] == upstream.generated[-1]
    assert last["prompt_token_ids"] == upstream.prompts[-1]
    # The proxy asked vLLM for token data on the capture call alone.
    asked = [bool(r.get("logprobs")) for r in upstream.requests]
    assert asked == [False, True]


async def test_a_capture_call_without_token_data_answers_200_marked_incomplete(
    transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    # 0.7's model server answers such a call 200 and marks the rollout's capture incomplete;
    # rollgym answered 502. With return_token_ids (token data promised) it still fails.
    upstream = VllmDouble(new_vllm=False)
    upstream.ignore_logprobs = True  # an upstream that gives no per-token logprobs
    params = {"input": "please answer v3"}
    path = "/ng-rollout/r1/training-token-capture/v1/responses"
    async with serve_asgi(upstream.app) as up_url:
        options = {"base_url": up_url + "/v1", "model": "toy"}
        with caplog.at_level(logging.WARNING, logger="rollgym.models.proxy"):
            async with client(transport, build(OpenAIProxy, "model", options)) as c:
                first = await c.post(path, params)
                second = await c.post(path, params)
        strict = {**options, "return_token_ids": True}
        async with client(transport, build(OpenAIProxy, "model", strict)) as c:
            promised = await c.post(path, params)
    assert first.status == second.status == 200, first.body
    assert first.body["output"][-1]["content"][0]["text"]  # the model's answer stands
    assert not any(k in first.body["output"][-1] for k in TRAINING)
    marked = first.body["rollgym_upstream"]["rollgym_token_capture"]
    assert marked["complete"] is False and "logprobs" in marked["reason"]
    warned = [r for r in caplog.records if "training-token-capture" in r.getMessage()]
    assert len(warned) == 1  # once per server, not once per call
    assert promised.status == 502
    assert "logprobs" in promised.body["error"]["message"]


# -- agent servers ----------------------------------------------------------------------------


async def test_an_agents_run_takes_its_rollout_id_from_the_prefix(transport: str) -> None:
    async with running_stack() as stack:
        peers = {
            "model": Target.single("model", stack.urls["model"][0], fast_policy("model")),
            "env": Target.single("env", stack.urls["env"][0], fast_policy("resources")),
        }
        options = {"model": "model", "resources": "env"}
        async with client(transport, build(ToolAgent, "agent", options, peers)) as agent:
            answer = await agent.post("/ng-rollout/12-3/run", task_row(1))
            header = await agent.post(
                "/ng-rollout/12-3/run", task_row(2), headers={HEADER_ROLLOUT: "from-header"}
            )
            bad = await agent.post("/ng-rollout/../run", task_row(3))
    assert answer.status == 200 and answer.body["reward"] == 1.0, answer.body
    assert answer.headers[HEADER_ROLLOUT.lower()] == "12-3"
    assert header.headers[HEADER_ROLLOUT.lower()] == "from-header"
    # Every model call of the rollout carried the id.
    assert stack.model.rollout_ids == ["12-3", "12-3", "from-header", "from-header"]
    assert bad.status == 404
