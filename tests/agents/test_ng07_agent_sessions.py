"""Agent sessions (NeMo Gym 0.7): an Environment Server seeds the resources, grants a rollgym
agent ``direct_http`` access, has it take one turn, closes it and verifies, exactly as 0.7's
``single_agent_turn`` does (sheet §1.4, steps 1-8), here with rollgym's own client."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from openai.types.responses import Response
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.responses import Response as HTTPResponse
from starlette.routing import Route

from rollgym.config import RetryPolicy
from rollgym.envs.lookup.server import LookupEnv
from rollgym.http import HttpClient, Target
from rollgym.nemo_gym.agent_sessions import AGENT_SESSION_COOKIE
from rollgym.server.base import ServerContext
from rollgym.server.endpoint import Call
from rollgym.testing import serve_asgi
from rollgym.wire import HEADER_OLDEST_VERSION
from tests.agents.ng07_stack import episode, lookup_row, mcqa_row, ng07_stack, post
from tests.support.servers import FaultyModel

pytestmark = pytest.mark.timeout(60)


def _cookie_header(cookies: dict[str, str]) -> dict[str, str]:
    return {"cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())} if cookies else {}


class SingleAgentTurn:
    """0.7's ``single_agent_turn`` sequence, step by step, through rollgym's ``HttpClient``."""

    def __init__(self, http: HttpClient, resources_url: str, agent_url: str) -> None:
        policy = RetryPolicy(max_attempts=1)
        self.http = http
        self.resources_url = resources_url
        self.resources = Target.single("resources", resources_url, policy)
        self.agent = Target.single("agent", agent_url, policy)
        self.seen: dict[str, Any] = {}

    async def _post(self, target: Target, path: str, body: Any, cookies: dict[str, str]) -> Any:
        return await self.http.call_with_cookies(
            target, path, body, headers=_cookie_header(cookies), deadline=20
        )

    async def run(self, request: dict[str, Any], direct_http: bool = True) -> dict[str, Any]:
        task_input = request["task"]["task_input"]
        episode_id, task_id = request["episode_id"], request["task"]["task_id"]
        # 1-2. Name the resources session; seed it. It must set a cookie.
        resources_session_id = f"resources-session-{os.urandom(16).hex()}"
        seed = {
            "resources_session_id": resources_session_id, "episode_id": episode_id,
            "task_id": task_id, "task_data": task_input["task_data"],
        }  # fmt: skip
        _, resources_cookies = await self._post(self.resources, "/seed_session", seed, {})
        assert resources_cookies, "Resources seed did not establish a session cookie"
        self.seen["seed_cookies"] = dict(resources_cookies)
        # 3. The grant: the resources root and the seed's cookies.
        accesses = [
            {"kind": "direct_http", "name": "lookup.direct_http", "required": True,
             "base_url": self.resources_url, "cookies": resources_cookies},
        ] if direct_http else []  # fmt: skip
        # 4. Seed the agent session; it sets the agent cookie.
        agent_session_id = f"agent-session-{os.urandom(16).hex()}"
        agent_seed = {
            "agent_session_id": agent_session_id, "episode_id": episode_id, "task_id": task_id,
            "tool_accesses": accesses, "sandbox_access": None,
        }  # fmt: skip
        answer, agent_cookies = await self._post(self.agent, "/v1/agent_sessions", agent_seed, {})
        assert answer == {"agent_session_id": agent_session_id}
        assert agent_cookies
        self.seen["agent_cookies"] = dict(agent_cookies)
        # 5. One turn, at /ng-rollout/<capture_key>/v1/responses, with the agent cookies.
        key = episode_id["rollout_id"]
        if episode_id.get("attempt"):
            key += f"-a{episode_id['attempt']}"
        response, turn_cookies = await self._post(
            self.agent, f"/ng-rollout/{key}/v1/responses",
            task_input["responses_create_params"], agent_cookies,
        )  # fmt: skip
        Response.model_validate(response)
        if turn_cookies:
            agent_cookies = turn_cookies
        # 6. Close the agent session: its resources cookies replace the jar.
        close = {"agent_session_id": agent_session_id, "episode_id": episode_id}
        closed, _ = await self._post(self.agent, "/v1/agent_sessions/close", close, agent_cookies)
        assert closed["agent_session_id"] == agent_session_id
        assert closed["agent_observations"] is None
        self.seen["closed"] = closed
        if closed["resources_cookies"] is not None:
            resources_cookies = closed["resources_cookies"]
        # 7. Verify: the resources server's flat body, with the resources cookies.
        body = {
            **task_input["task_data"],
            "responses_create_params": task_input["responses_create_params"],
            "response": response,
        }
        verified, _ = await self._post(self.resources, "/verify", body, resources_cookies)
        # 8. The result: the verify response + ng_agent_observations.
        assert isinstance(verified, dict)
        return {**verified, "ng_agent_observations": closed["agent_observations"]}


async def test_single_agent_turn_on_a_rollgym_agent_gets_the_flat_runs_reward() -> None:
    row = lookup_row()
    # The agent's own resources server is another lookup: the turn must reach the granted one.
    async with (
        ng07_stack(agents={"agent": "other"}, extra_envs={"other": LookupEnv}) as stack,
        HttpClient() as http,
    ):
        _, flat, _, _ = await post(stack.urls["agent"] + "/run", row)
        turn = SingleAgentTurn(http, stack.urls["lookup"], stack.urls["agent"])
        result = await turn.run(episode(row, "5-0"))
        rollouts = list(stack.model.rollout_ids)
    assert flat["reward"] == 1.0
    assert result["reward"] == flat["reward"] and result["tool_called"] == 1
    assert result["ng_agent_observations"] is None
    # The granted session's cookie jar came back at close, the seed's cookie in it.
    closed = turn.seen["closed"]
    assert closed["resources_cookies"].items() >= turn.seen["seed_cookies"].items()
    assert AGENT_SESSION_COOKIE in turn.seen["agent_cookies"]
    assert rollouts[-2:] == ["5-0", "5-0"]  # the turn's model calls carry the capture key


async def test_a_session_without_tools_takes_a_turn_granted_nothing() -> None:
    async with ng07_stack(agents={"agent": "mcqa"}) as stack, HttpClient() as http:
        turn = SingleAgentTurn(http, stack.urls["mcqa"], stack.urls["agent"])
        result = await turn.run(episode(mcqa_row(), taskset="mcqa:t"), direct_http=False)
    assert result["reward"] == 1.0
    assert turn.seen["closed"]["resources_cookies"] is None  # nothing granted, nothing to hand back


async def test_two_concurrent_sessions_never_share_a_resources_session() -> None:
    async with ng07_stack() as stack, HttpClient() as http:
        turns = [SingleAgentTurn(http, stack.urls["lookup"], stack.urls["agent"]) for _ in "ab"]
        looked_up, guessed = await asyncio.gather(
            turns[0].run(episode(lookup_row(), "1-0")),
            turns[1].run(episode(lookup_row(call=False), "2-0")),
        )
    assert looked_up["tool_called"] == 1 and looked_up["reward"] == 1.0
    assert guessed["tool_called"] == 0 and guessed["reward"] == 0.0  # A's lookup stayed A's
    a, b = (t.seen for t in turns)
    assert a["agent_cookies"] != b["agent_cookies"]
    assert a["closed"]["resources_cookies"] != b["closed"]["resources_cookies"]


async def test_the_grants_cookies_and_headers_reach_the_tool() -> None:
    seen: list[tuple[dict[str, str], dict[str, str]]] = []

    async def lookup(request: Request) -> JSONResponse:
        seen.append((dict(request.cookies), dict(request.headers)))
        response = JSONResponse({"population": "48,213"})
        response.set_cookie("tool_jar", "turned")  # set during the turn: handed back at close
        return response

    app = Starlette(routes=[Route("/lookup", lookup, methods=["POST"])])
    async with serve_asgi(app) as tools_url, ng07_stack() as stack:
        agent = stack.urls["agent"]
        ids = {"episode_id": {"rollout_id": "h-1"}, "task_id": {"taskset": "x", "task_id": "y"}}
        grant = {
            "kind": "direct_http", "name": "tools", "required": True, "base_url": tools_url,
            "cookies": {"granted": "c1"}, "headers": {"x-grant": "h1"},
        }  # fmt: skip
        seed = {"agent_session_id": "s-1", **ids, "tool_accesses": [grant]}
        status, _, cookies, _ = await post(agent + "/v1/agent_sessions", seed)
        assert status == 200
        status, response, _, _ = await post(
            agent + "/v1/responses", lookup_row()["responses_create_params"], cookies
        )
        assert status == 200, response
        _, closed, _, _ = await post(
            agent + "/v1/agent_sessions/close",
            {"agent_session_id": "s-1", "episode_id": ids["episode_id"]}, cookies,
        )  # fmt: skip
    assert len(seen) == 1
    tool_cookies, tool_headers = seen[0]
    assert tool_cookies == {"granted": "c1"} and tool_headers["x-grant"] == "h1"
    assert closed["resources_cookies"] == {"granted": "c1", "tool_jar": "turned"}


# -- the session rules (0.7's statuses) ----------------------------------------------------


def _seed(sid: str = "s-1", rollout: str = "e-1", **extra: Any) -> dict[str, Any]:
    return {
        "agent_session_id": sid,
        "episode_id": {"rollout_id": rollout, "attempt": 0},
        "task_id": {"taskset": "lookup:t", "task_id": "t0"},
        **extra,
    }


def _close(sid: str = "s-1", rollout: str = "e-1") -> dict[str, Any]:
    return {"agent_session_id": sid, "episode_id": {"rollout_id": rollout, "attempt": 0}}


async def test_the_session_rules_are_0_7s() -> None:
    params = mcqa_row()["responses_create_params"]
    async with ng07_stack(agents={"agent": "mcqa"}) as stack:
        url = stack.urls["agent"]
        seed, close, turn = (url + p for p in ("/v1/agent_sessions",
                                               "/v1/agent_sessions/close", "/v1/responses"))  # fmt: skip
        status, _, cookies, _ = await post(seed, _seed())
        assert status == 200 and AGENT_SESSION_COOKIE in cookies
        # An identical retry is the same session; another seed under that id is refused.
        assert (await post(seed, _seed()))[0] == 200
        status, body, _, _ = await post(seed, _seed(rollout="e-2"))
        assert status == 409 and "already bound to another seed" in body["error"]["message"]
        # A cookie naming another session.
        status, body, _, _ = await post(seed, _seed("s-2"), cookies)
        assert status == 409 and "does not match the session cookie" in body["error"]["message"]
        # Turns in the session (0.7's token-capture path too), then a close naming another
        # episode.
        assert (await post(turn, params, cookies))[0] == 200
        capture = url + "/ng-rollout/e-1/training-token-capture/v1/responses"
        assert (await post(capture, params, cookies))[0] == 200
        status, body, _, _ = await post(close, _close(rollout="e-9"), cookies)
        assert status == 409 and "episode_id does not match" in body["error"]["message"]
        # The close, and the same body again.
        status, first, _, _ = await post(close, _close(), cookies)
        assert status == 200
        assert first == {
            "agent_session_id": "s-1", "agent_observations": None, "resources_cookies": None,
        }  # fmt: skip
        assert (await post(close, _close(), cookies))[1] == first
        # A closed session takes no turn and no seed.
        status, body, _, _ = await post(turn, params, cookies)
        assert status == 409 and "Unknown or closing" in body["error"]["message"]
        status, body, _, _ = await post(seed, _seed())
        assert status == 409 and "already closed" in body["error"]["message"]
        # A close of an unknown id answers nulls and blocks a later seed of it.
        status, body, _, _ = await post(close, _close("s-3"))
        assert status == 200 and body["resources_cookies"] is None
        assert (await post(seed, _seed("s-3")))[0] == 409


async def test_a_dropped_session_says_why() -> None:
    # Room for one seed body: the second seed drops the first, oldest first.
    async with ng07_stack(agents={"agent": "mcqa"}, agent_limits={"sessions_bytes": 1}) as stack:
        url = stack.urls["agent"]
        _, _, first, _ = await post(url + "/v1/agent_sessions", _seed("s-1"))
        assert (await post(url + "/v1/agent_sessions", _seed("s-2")))[0] == 200
        status, body, _, _ = await post(
            url + "/v1/responses", mcqa_row()["responses_create_params"], first
        )
    assert status == 409
    assert "limits.sessions_bytes" in body["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"sandbox_access": {"connection": {}, "workdir": "/w"}}, "sandbox_access"),
        (
            {"tool_accesses": [{"kind": "mcp", "name": "m", "required": True,
                                "connection": {"url": "http://127.0.0.1:9/mcp"}}]},
            "required MCP tool access 'm'",
        ),
        (
            {"tool_accesses": [
                {"kind": "direct_http", "name": n, "required": True, "base_url": "http://a.b"}
                for n in ("one", "two")
            ]},
            "more than one direct_http",
        ),
        (
            {"tool_accesses": [{"kind": "direct_http", "name": "d", "required": True,
                                "base_url": "http://a.b", "headers": {"x": "a\r\nb: c"}}]},
            "header 'x'",
        ),
        (
            {"tool_accesses": [{"kind": "direct_http", "name": "d", "required": True,
                                "base_url": "http://a.b", "cookies": {"c": "a; b=2"}}]},
            "cookie 'c'",
        ),
        ({"tool_accesses": [{"kind": "ftp", "name": "d", "required": True}]}, "tool_accesses"),
        ({"agent_session_id": "x" * 100_000}, "agent_session_id"),
        ({"episode_id": {"rollout_id": "bad id"}}, "episode_id.rollout_id"),
    ],
)  # fmt: skip
async def test_what_the_agent_cannot_use_is_a_422_naming_it(
    extra: dict[str, Any], named: str
) -> None:
    async with ng07_stack(agents={"agent": "mcqa"}) as stack:
        status, body, cookies, _ = await post(
            stack.urls["agent"] + "/v1/agent_sessions", {**_seed(), **extra}
        )
    assert status == 422, body
    assert named in body["error"]["message"] and len(body["error"]["message"]) < 2000
    assert cookies == {}


async def test_an_optional_mcp_access_is_skipped() -> None:
    mcp = {"kind": "mcp", "name": "m", "required": False, "connection": {"url": "http://x/mcp"}}
    async with ng07_stack(agents={"agent": "mcqa"}) as stack:
        status, _, _, _ = await post(
            stack.urls["agent"] + "/v1/agent_sessions", _seed(tool_accesses=[mcp])
        )
    assert status == 200


async def test_a_tool_call_in_a_session_granted_nothing_names_the_missing_grant() -> None:
    async with ng07_stack() as stack:
        url = stack.urls["agent"]
        _, _, cookies, _ = await post(url + "/v1/agent_sessions", _seed())
        status, body, _, _ = await post(
            url + "/v1/responses", lookup_row()["responses_create_params"], cookies
        )
        lookups = stack.servers["lookup"]
    assert status == 400, body
    assert "granted no resources access" in body["error"]["message"]
    assert "direct_http" in body["error"]["message"]
    assert isinstance(lookups, LookupEnv)


async def test_a_turn_without_a_session_runs_on_the_agents_own_resources() -> None:
    async with ng07_stack() as stack:
        status, response, cookies, _ = await post(
            stack.urls["agent"] + "/ng-rollout/free-1/v1/responses",
            lookup_row()["responses_create_params"],
        )
        rollouts = list(stack.model.rollout_ids)
    assert status == 200, response
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]
    assert cookies == {}
    assert rollouts == ["free-1", "free-1"]  # the path names the rollout


class CaptureSeeing(FaultyModel):
    """Records, per model call, whether it came at 0.7's token-capture path."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.captures: list[bool] = []

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | HTTPResponse:
        self.captures.append(call.token_capture)
        return await super().respond(params, call)


async def test_a_turn_asking_for_token_ids_asks_its_model_for_them() -> None:
    params = mcqa_row()["responses_create_params"]
    async with ng07_stack(agents={"agent": "mcqa"}, model=CaptureSeeing) as stack:
        url = stack.urls["agent"]
        _, _, cookies, _ = await post(url + "/v1/agent_sessions", _seed())
        plain, _, _, _ = await post(url + "/ng-rollout/e-1/v1/responses", params, cookies)
        capture, body, _, _ = await post(
            url + "/ng-rollout/e-1/training-token-capture/v1/responses", params, cookies
        )
        free, _, _, _ = await post(url + "/ng-rollout/x:1/training-token-capture/v1/responses",
                                   params)  # fmt: skip
        model = stack.model
    assert (plain, capture) == (200, 200), body
    assert isinstance(model, CaptureSeeing)
    assert model.captures == [False, True]
    assert free == 404  # not a 0.7 rollout id: the app names no endpoint (0.7 too)


class OldestSeeing(FaultyModel):
    """Records the ``x-rollgym-oldest-version`` of every model call (None: not sent)."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.oldest: list[str | None] = []

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | HTTPResponse:
        self.oldest.append(call.headers.get(HEADER_OLDEST_VERSION))
        return await super().respond(params, call)


async def test_a_sessions_later_turns_tell_the_model_its_oldest_version() -> None:
    """Bounded staleness across turns: the model server stamped turn 1's call with version 5,
    so turn 2's first call already says the rollout's oldest version is 5 (a model server with
    a staleness bound can refuse it); another session's first turn says nothing."""
    params = mcqa_row()["responses_create_params"]
    async with ng07_stack(agents={"agent": "mcqa"}, model=OldestSeeing) as stack:
        url = stack.urls["agent"]
        model = stack.model
        assert isinstance(model, OldestSeeing)
        model.policy.raise_version(5)
        _, _, cookies, _ = await post(url + "/v1/agent_sessions", _seed())
        for _ in range(2):
            status, body, _, _ = await post(url + "/ng-rollout/e-1/v1/responses", params, cookies)
            assert status == 200, body
        _, _, other, _ = await post(url + "/v1/agent_sessions", _seed("s-2", "e-2"))
        status, body, _, _ = await post(url + "/ng-rollout/e-2/v1/responses", params, other)
        assert status == 200, body
    assert model.oldest == [None, "5", None]


async def test_a_gymnasium_agent_refuses_sessions_with_501() -> None:
    async with ng07_stack(agent_impl="gymnasium_agent", agents={"agent": "lookup"}) as stack:
        status, body, _, _ = await post(stack.urls["agent"] + "/v1/agent_sessions", _seed())
        turn_status, _, _, _ = await post(
            stack.urls["agent"] + "/v1/responses", mcqa_row()["responses_create_params"]
        )
    assert status == 501 and "does not take agent-session turns" in body["error"]["message"]
    assert turn_status == 501
