"""A NeMo Gym 0.7 test stack: the scripted model (``FaultyModel``), rollgym's lookup and mcqa
environments, and tool agents on them, all served on 127.0.0.1; lookup and mcqa rows with a
script that scores 1.0; 0.7 episode bodies for them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from rollgym.envs.lookup.server import LookupEnv
from rollgym.envs.mcqa.server import MCQAEnv
from rollgym.errors import InternalError
from rollgym.http import Target
from rollgym.server.base import BaseServer
from rollgym.server.resources import Session
from rollgym.testing import serve_server
from tests.support.servers import FAIL_MARKER, FaultyModel
from tests.support.stack import fast_policy

TIMEOUT = aiohttp.ClientTimeout(total=20)

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "lookup",
    "description": "Look up a Norrowvale registry entry by key.",
    "parameters": {
        "type": "object",
        "properties": {"key": {"type": "string"}},
        "required": ["key"],
        "additionalProperties": False,
    },
}


def lookup_row(
    *, town: str = "Brackenholt", call: bool = True, fail: bool = False
) -> dict[str, Any]:
    """A lookup task (Brackenholt: 48,213 people). ``call``: the script looks it up first (the
    env pays only then); ``fail``: the ``FaultyModel`` fails every call."""
    say = {"say": "The registry lists Brackenholt with a population of 48,213."}
    script = [{"call": "lookup", "arguments": {"key": town}}, say] if call else [say]
    text = f"How many people live in {town}?" + (f" {FAIL_MARKER}" if fail else "")
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": text}],
            "tools": [LOOKUP_TOOL],
            "metadata": {"rollgym_script": orjson.dumps(script).decode()},
        },
        "expected_answer": "48213",
    }


def mcqa_row() -> dict[str, Any]:
    """An mcqa task without tools, answered right (A)."""
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Which planet has the shortest year?"}],
            "metadata": {"rollgym_script": orjson.dumps([{"say": "\\boxed{A}"}]).decode()},
        },
        "expected_answer": "A",
        "options": {"A": "Mercury", "B": "Jupiter", "C": "Venus", "D": "Mars"},
    }


def episode(
    row: dict[str, Any], rollout_id: str = "7-0", attempt: int = 0, taskset: str = "lookup:t"
) -> dict[str, Any]:
    """``row`` as 0.7's episode request: its fields other than the create params go in
    ``task_data``."""
    data = {k: v for k, v in row.items() if k != "responses_create_params"}
    return {
        "episode_id": {"rollout_id": rollout_id, "attempt": attempt},
        "task": {
            "task_id": {"taskset": taskset, "task_id": "t0"},
            "task_input": {
                "responses_create_params": row["responses_create_params"],
                "task_data": data,
            },
        },
    }


class FailingLookup(LookupEnv):
    """The lookup env, failing (500) at ``fail_at``: ``seed``, ``tool`` or ``verify``."""

    class Options(LookupEnv.Options):
        fail_at: str | None = None

    options: Options

    def _fail(self, where: str) -> None:
        if self.options.fail_at == where:
            raise InternalError(f"injected {where} failure", server=self.name)

    async def seed_session(self, session: Session) -> None:
        self._fail("seed")
        await super().seed_session(session)

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        self._fail("verify")
        return await super().verify(session, task, response)


@dataclass
class Ng07Stack:
    urls: dict[str, str]
    model: FaultyModel
    servers: dict[str, BaseServer]


@asynccontextmanager
async def ng07_stack(
    *,
    agent_impl: str = "tool_agent",
    agents: dict[str, str] | None = None,
    model: type[FaultyModel] = FaultyModel,
    model_options: dict[str, Any] | None = None,
    lookup_options: dict[str, Any] | None = None,
    agent_limits: dict[str, Any] | None = None,
    extra_envs: dict[str, type[BaseServer]] | None = None,
) -> AsyncIterator[Ng07Stack]:
    """Serve the model, ``lookup`` (a ``FailingLookup``), ``mcqa``, any ``extra_envs``, and
    one agent per entry of ``agents`` (agent name -> its resources server; default
    ``{"agent": "lookup", "mcqa_agent": "mcqa"}``). Retries are fast: a failing model fails
    after its 3 attempts in milliseconds."""
    agents = agents or {"agent": "lookup", "mcqa_agent": "mcqa"}
    envs: dict[str, type[BaseServer]] = {"lookup": FailingLookup, "mcqa": MCQAEnv}
    envs |= extra_envs or {}
    async with AsyncExitStack() as stack:
        urls: dict[str, str] = {}
        servers: dict[str, BaseServer] = {}
        urls["model"], servers["model"] = await stack.enter_async_context(
            serve_server(model, name="model", options=model_options)
        )
        for name, klass in envs.items():
            options = lookup_options if name == "lookup" else None
            urls[name], servers[name] = await stack.enter_async_context(
                serve_server(klass, name=name, options=options)
            )
        peers = {"model": Target.single("model", urls["model"], fast_policy("model"))}
        peers |= {n: Target.single(n, urls[n], fast_policy("resources")) for n in envs}
        for name, resources in agents.items():
            urls[name], servers[name] = await stack.enter_async_context(
                serve_server(
                    agent_impl,
                    name=name,
                    peers=peers,
                    limits=agent_limits,
                    options={"model": "model", "resources": resources},
                )
            )
        served = servers["model"]
        assert isinstance(served, FaultyModel)
        yield Ng07Stack(urls, served, servers)


async def post(
    url: str, body: Any, cookies: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str], aiohttp.typedefs.LooseHeaders]:
    """POST ``body``: (status, JSON answer, the cookies it set, its headers). Cookies go by
    hand, as 0.7's servers send them (no jar)."""
    jar = aiohttp.DummyCookieJar()
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=jar) as http,
        http.post(url, data=orjson.dumps(body), cookies=cookies) as resp,
    ):
        raw = await resp.read()
        set_cookies = {k: m.value for k, m in resp.cookies.items()}
        return resp.status, orjson.loads(raw) if raw else None, set_cookies, resp.headers
