"""``GymnasiumServer``, the base of rollgym's own ``/reset`` + ``/step`` environments: one small
class, played by the Gymnasium agent, its sessions in the store ``ResourcesServer`` uses."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from rollgym.agents.gymnasium import parse_reset, parse_step
from rollgym.envs.guess.server import GuessEnv
from rollgym.http import Target
from rollgym.protocol import Reset, Step, ToolOutput
from rollgym.server.gymnasium import GymnasiumServer, Session
from rollgym.testing import serve_server
from rollgym.wire import SESSION_COOKIE, SESSION_HEADER
from tests.support.stack import fast_policy

pytestmark = pytest.mark.timeout(30)

AGENT = "rollgym.agents.gymnasium:GymnasiumAgent"
TIMEOUT = aiohttp.ClientTimeout(total=15)


class Countdown(GymnasiumServer):
    """Say anything ``start`` times; every step but the last hands back a tool output."""

    row_fields = frozenset({"start"})

    async def reset(self, session: Session) -> Reset:
        session.data["left"] = session.task["start"]
        return Reset("Say 'go' until I stop you.", {"start": session.task["start"]})

    async def step(self, session: Session, response: dict[str, Any]) -> Step:
        session.data["left"] -= 1
        done = session.data["left"] == 0
        if done:
            return Step(None, 1.0, terminated=True)
        return Step("Again.", 0.0, tool_outputs=(ToolOutput("call_x", "left"),))


class Broken(GymnasiumServer):
    async def step(self, session: Session, response: dict[str, Any]) -> Any:
        return {"reward": 1.0}  # not a Step


def row(**fields: Any) -> dict[str, Any]:
    script = orjson.dumps([{"say": "go"}]).decode()
    return {
        "responses_create_params": {"input": "Play.", "metadata": {"rollgym_script": script}},
        **fields,
    }


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, sid: str | None = None
) -> tuple[int, Any, str | None]:
    headers = {SESSION_HEADER: sid} if sid else {}
    async with http.post(url, data=orjson.dumps(body), headers=headers) as resp:
        cookie = resp.cookies.get(SESSION_COOKIE)
        return resp.status, orjson.loads(await resp.read()), cookie.value if cookie else None


async def test_a_small_class_is_played_by_the_gymnasium_agent() -> None:
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_server(Countdown, name="env") as (env_url, env),
    ):
        peers = {
            "model": Target.single("model", model_url, fast_policy("model")),
            "env": Target.single("env", env_url, fast_policy("resources")),
        }
        options = {"model": "model", "resources": "env", "max_steps": 5}
        async with (
            serve_server(AGENT, name="agent", options=options, peers=peers) as (url, _),
            aiohttp.ClientSession(timeout=TIMEOUT) as http,
            http.post(url + "/run", data=orjson.dumps(row(start=3))) as resp,
        ):
            status, body = resp.status, orjson.loads(await resp.read())
        assert isinstance(env, Countdown) and env.open_episodes == 0  # ended with its episode
    assert status == 200, body
    assert body["step_rewards"] == [0.0, 0.0, 1.0] and body["reward"] == 1.0
    assert body["terminated"] is True and body["truncated"] is False
    outputs = [i for i in body["response"]["output"] if i["type"] == "function_call_output"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [("call_x", "left")] * 2
    assert env.health()["row_fields"] == ["start"] and env.health()["kind"] == "resources"


async def test_the_session_travels_by_cookie_or_header_and_ends_with_the_episode() -> None:
    async with (
        serve_server(Countdown, name="env") as (url, _),
        aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        status, reset, sid = await post(http, url + "/reset", row(start=2))
        assert status == 200 and sid
        assert parse_reset(reset, "env") == Reset("Say 'go' until I stop you.", {"start": 2})
        step = {**row(start=2), "response": {"output": []}}
        status, first, again = await post(http, url + "/step", step, sid)
        assert status == 200 and again == sid  # the cookie, set again
        assert parse_step(first, "env").tool_outputs == (ToolOutput("call_x", "left"),)
        async with http.post(
            url + "/step", data=orjson.dumps(step), headers={"cookie": f"{SESSION_COOKIE}={sid}"}
        ) as resp:
            assert resp.status == 200 and (await resp.json())["terminated"] is True
        status, over, _ = await post(http, url + "/step", step, sid)
    assert status == 404 and "no episode" in over["error"]["message"]


async def test_a_step_that_is_no_step_is_the_servers_error() -> None:
    async with (
        serve_server(Broken, name="env") as (url, _),
        aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        status, reset, sid = await post(http, url + "/reset", row())
        assert status == 200 and reset == {"observation": None, "info": {}}
        status, body, _ = await post(http, url + "/step", {"response": {"output": []}}, sid)
    assert status == 500 and "Broken.step returned no Step" in body["error"]["message"]


async def test_episodes_are_held_within_the_session_bounds_oldest_dropped_first() -> None:
    limits = {"seed_bytes": 256 * 1024, "sessions_bytes": 1 << 20}
    big = row(secret=7, pad="p" * 200_000)  # about 200 KB each
    async with (
        serve_server(GuessEnv, name="guess", limits=limits) as (url, env),
        aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        sids = [(await post(http, url + "/reset", big))[2] for _ in range(12)]
        assert isinstance(env, GuessEnv) and env.open_episodes < 12
        step = {**big, "response": {"output": []}}
        status, body, _ = await post(http, url + "/step", step, sids[0])
        assert status == 404 and "servers.guess.limits.sessions_bytes" in body["error"]["message"]
        status, body, _ = await post(http, url + "/step", step, sids[-1])
        assert status == 200 and body["reward"] == -0.1


def test_a_step_record_goes_over_the_wire_and_back_unchanged() -> None:
    step = Step("hi", 0.5, truncated=True, info={"k": 1}, tool_outputs=(ToolOutput("c", "o"),))
    back = parse_step(orjson.loads(orjson.dumps(step.to_dict())), "env")
    assert back.to_dict() == step.to_dict()
    assert (back.observation, back.reward, back.truncated, back.tool_outputs) == (
        "hi", 0.5, True, step.tool_outputs,
    )  # fmt: skip


async def test_a_gymnasium_server_answers_its_fingerprint() -> None:
    """Scored by its own package's code, data and version, as a resources server is (it was
    recorded as unknown: no /fingerprint); the collector asks every resources server."""
    from rollgym.server.fingerprint import Fingerprint

    class Versioned(Countdown):
        version = "7"

    async with (
        serve_server(Versioned, name="countdown") as (url, server),
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.get(url + "/fingerprint") as resp,
    ):
        said = await resp.json()
    assert resp.status == 200
    assert said == server.fingerprint.to_dict()  # type: ignore[attr-defined]
    assert (
        said["version"] == "7" and "tests/agents/test_gymnasium_server.py" in said["code"]["files"]
    )
    assert said["id"] != Fingerprint.of(Countdown).id  # the version is part of it
