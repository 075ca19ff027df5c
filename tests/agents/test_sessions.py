"""Sessions both ways between rollgym and NeMo Gym: the header, the cookie, never shared.

- rollgym's resources server, called by a cookie-only client that keeps just the cookies of the
  latest answer (what NeMo Gym's agents do), still gives each rollout its own session.
- rollgym's ``Episode``, calling a NeMo Gym style server (a signed session cookie named after the
  server, set again on every answer, as Starlette's SessionMiddleware does there), carries that
  cookie on every call of its rollout only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.config import RetryPolicy
from rollgym.envs.lookup.server import LookupEnv
from rollgym.http import HttpClient, Target
from rollgym.server.episode import ResourcesClient
from rollgym.testing import serve_asgi, serve_server
from rollgym.wire import SESSION_COOKIE, SESSION_HEADER
from tests.envs.env_client import reply
from tests.support.nemo_session import SignedSession

pytestmark = pytest.mark.timeout(30)

TIMEOUT = aiohttp.ClientTimeout(total=10)
TASK = {"responses_create_params": {"input": "x"}, "expected_answer": "48,213"}


async def test_a_cookie_only_agent_gets_a_real_session_on_a_rollgym_server() -> None:
    jar = aiohttp.DummyCookieJar()  # cookies passed by hand, per rollout, as NeMo Gym does
    async with (
        serve_server(LookupEnv, name="lookup") as (url, _),
        aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=jar) as http,
    ):

        async def post(path: str, body: Any, cookies: Mapping[str, str]) -> Any:
            async with http.post(url + path, json=body, cookies=cookies) as resp:
                kept = {k: m.value for k, m in resp.cookies.items()}  # the latest answer's only
                return resp.status, await resp.json(), kept

        _, _, cookies_a = await post("/seed_session", TASK, {})
        _, _, cookies_b = await post("/seed_session", TASK, {})
        assert cookies_a[SESSION_COOKIE] != cookies_b[SESSION_COOKIE]
        # Rollout A looks up (a refused lookup first: its answer must keep the cookie too).
        status, _, cookies_a = await post("/lookup", {"key": "no such town"}, cookies_a)
        assert status == 404 and SESSION_COOKIE in cookies_a
        _, _, cookies_a = await post("/lookup", {"key": "Brackenholt"}, cookies_a)
        answer = {**TASK, "response": reply("about 48,213 people")}
        _, verified_a, _ = await post("/verify", answer, cookies_a)
        _, verified_b, _ = await post("/verify", answer, cookies_b)
    assert verified_a["tool_called"] == 1 and verified_a["reward"] == 1.0
    assert verified_b["tool_called"] == 0  # A's lookups never reached B's session


async def test_the_header_wins_over_a_stale_cookie() -> None:
    async with (
        serve_server(LookupEnv, name="lookup") as (url, _),
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):
        sids = []
        for _ in range(2):
            async with http.post(url + "/seed_session", json=TASK) as resp:
                sids.append((await resp.json())["session_id"])
        headers = {SESSION_HEADER: sids[1], "cookie": f"{SESSION_COOKIE}={sids[0]}"}
        async with http.post(url + "/lookup", json={"key": "Brackenholt"}, headers=headers):
            pass
        verified = []
        for sid in sids:
            body = {**TASK, "response": reply("48,213")}
            async with http.post(url + "/verify", json=body, headers={SESSION_HEADER: sid}) as r:
                verified.append(await r.json())
    assert [v["tool_called"] for v in verified] == [0, 1]


class NemoStyleEnv:
    """A resources server the way NeMo Gym 0.4 builds one: a session id in Starlette's signed
    session cookie named ``<Class>___<name>``, set again on every answer."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        routes = [
            Route("/seed_session", self.seed, methods=["POST"]),
            Route("/count", self.count, methods=["POST"]),
            Route("/verify", self.verify, methods=["POST"]),
        ]
        self.app = SignedSession(Starlette(routes=routes), "NemoStyleEnv___env")

    async def seed(self, request: Request) -> JSONResponse:
        self.counts[request.session["session_id"]] = 0
        return JSONResponse({})

    async def count(self, request: Request) -> JSONResponse:
        sid = request.session["session_id"]
        self.counts[sid] = self.counts.get(sid, 0) + 1
        await asyncio.sleep(0.01)  # let the other rollout's calls interleave
        return JSONResponse({"count": self.counts[sid]})

    async def verify(self, request: Request) -> JSONResponse:
        body = await request.json()
        count = self.counts.get(request.session["session_id"], -1)
        return JSONResponse({**body, "reward": float(count == body["expected"]), "count": count})


async def test_an_episode_carries_a_nemo_gym_session_cookie_for_its_rollout_only() -> None:
    env = NemoStyleEnv()
    async with serve_asgi(env.app) as url, HttpClient() as http:
        resources = ResourcesClient(http, Target.single("env", url, RetryPolicy()))

        async def rollout(key: str, calls: int) -> dict[str, Any]:
            episode = resources.episode(key)
            await episode.seed({"responses_create_params": {"input": key}})
            outputs = [await episode.call_tool("count", {}) for _ in range(calls)]
            assert orjson.loads(outputs[-1]) == {"count": calls}
            return await episode.verify({"expected": calls}, reply("done"))

        first, second = await asyncio.gather(rollout("0:0", 3), rollout("1:0", 5))
    assert (first["count"], first["reward"]) == (3, 1.0)
    assert (second["count"], second["reward"]) == (5, 1.0)
    assert len(env.counts) == 2  # two sessions, one per rollout
    sent = env.app.sent
    seeds = [cookie for path, cookie in sent if path == "/seed_session"]
    assert seeds == [None, None]  # a seed carries no one's cookie (the client keeps no jar)
    cookies = {cookie for path, cookie in sent if path != "/seed_session"}
    # Each rollout sent its own session cookie on every later call: two distinct values.
    assert all(c and c.startswith("NemoStyleEnv___env=") for c in cookies)
    assert len({c.split(";")[0] for c in cookies if c}) >= 2


async def test_an_episode_on_a_rollgym_server_needs_no_cookie_support() -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _), HttpClient() as http:
        resources = ResourcesClient(http, Target.single("lookup", url, RetryPolicy()))
        tools = await resources.tools()
        episode = resources.episode("0:0")
        await episode.seed(TASK)
        assert episode.session_id
        refused = await episode.call_tool("verify", {})  # not a tool, whatever a model says
        found = await episode.call_tool("lookup", {"key": "Brackenholt"})
        missing = await episode.call_tool("lookup", {"key": "Atlantis"})
        verified = await episode.verify(TASK, reply("48,213"))
    assert [t["name"] for t in tools] == ["lookup"]
    assert orjson.loads(refused) == {"error": "unknown tool 'verify'"}
    assert "48,213" in found or "48213" in found
    assert "no registry entry" in orjson.loads(missing)["error"]
    assert verified["tool_called"] == 1 and verified["reward"] == 1.0
