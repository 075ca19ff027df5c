"""A scripted model whose answers can be held mid-call (in-process tests of the policy gate):
its ``respond`` runs inside the gate, so a pause with ``abort`` cancels it like an upstream
request, and a re-issue calls it again."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response

from rollgym.control_token import authorization, control_token
from rollgym.server.endpoint import Call
from rollgym.wire import HEADER_OLDEST_VERSION
from tests.support.servers import FaultyModel

HOLD_LIMIT = 60.0
"""Seconds a held answer waits at most (longer than any test that holds one)."""
TIMEOUT = aiohttp.ClientTimeout(total=60)


class HeldModel(FaultyModel):
    """The scripted model. Each call's work records the gate's live version as it starts
    (``starts``) and the request it got (``requests_seen``), then waits until ``go`` is set
    (set at first: nothing is held). ``cancelled`` counts works cancelled while waiting;
    ``oldest_headers`` the ``x-rollgym-oldest-version`` of every call that reached it."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.go = asyncio.Event()
        self.go.set()
        self.starts: list[int] = []
        self.requests_seen: list[bytes] = []
        self.cancelled = 0
        self.oldest_headers: list[str | None] = []
        self.free_calls: int | None = None
        """If set: that many first calls pass without waiting for ``go`` (which is then
        cleared): a rollout's later calls can be held mid-rollout."""

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        await self._hold_here(params, call)
        return await super().respond(params, call)

    async def _chat(self, body: Any, call: Call) -> Any:
        # Chat completions too (what openai_proxy sends upstream): the scripted model has no
        # public hook there, and this is a test double.
        await self._hold_here(body, call)
        return await super()._chat(body, call)

    async def _hold_here(self, params: Any, call: Call) -> None:
        self.starts.append(self.policy.version)
        self.requests_seen.append(orjson.dumps(params, option=orjson.OPT_SORT_KEYS))
        self.oldest_headers.append(call.headers.get(HEADER_OLDEST_VERSION))
        if self.free_calls is not None and len(self.starts) <= self.free_calls:
            return
        try:
            await asyncio.wait_for(self.go.wait(), HOLD_LIMIT)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """POST ``body`` (JSON) with the control token (``headers`` may replace it) and return
    (status, JSON answer)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    sent = {**authorization(control_token()), **(headers or {})}
    async with session.post(url, data=data, headers=sent) as resp:
        return resp.status, orjson.loads(await resp.read())


async def get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200
        return orjson.loads(await resp.read())
