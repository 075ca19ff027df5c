"""``rollgym audit`` of an OpenEnv environment: the panel played through its ``/ws`` session.

An OpenEnv server is recognized by its ``GET /schema`` (an object with an ``action`` schema).
One play is one episode, as ``openenv_agent`` with ``text_action`` plays it: a socket of its
own, ``reset`` with the row's ``openenv_reset``, one ``step`` whose action is the answer in the
action's text field, the step's reward (a null reward is 0, as the agent sums it). An
environment whose task is in its first observation (a word to reverse) gives that observation
to the panel as the row's last message (``prepare``), as the agent shows it to the model.

Never trusting the server, as ``rollgym.audit.target``: one attempt per step within the
timeout; an error or a dropped socket is a ``crash``, a refused action (``VALIDATION_ERROR``)
is ``refused``; a server that timed out ``MAX_TIMEOUTS`` times gets no more plays. A full
server (``CAPACITY_REACHED``: it holds ``max_concurrent_envs`` sessions) is no finding: the
player holds fewer sessions at once from then on and opens the episode again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson

from rollgym.audit.panel import ToolCall
from rollgym.audit.target import MAX_TIMEOUTS, Outcome, Play, Player, audit_policy
from rollgym.errors import CapacityReached, RollgymError
from rollgym.http import Target
from rollgym.openenv.agent import RESET_FIELD
from rollgym.openenv.session import Observation, OpenEnvSession, Refused
from rollgym.wire import OPENENV_SCHEMA_PATH

_FULL_WAIT = 0.05
"""Seconds before a full server is asked again."""


class OpenEnvPlayer:
    """Plays answers on the OpenEnv server ``target`` as text actions in field ``field``."""

    gym = True

    def __init__(
        self,
        http: aiohttp.ClientSession,
        target: Target,
        field: str | None,
        timeout: float,
        concurrency: int,
    ) -> None:
        self.http, self.target, self.field, self.timeout = http, target, field, timeout
        self.timeouts = 0
        self._limit = asyncio.Semaphore(concurrency)
        self._cap = concurrency
        self._held: list[asyncio.Task[Any]] = []
        self._plays = 0

    async def detect(self) -> list[dict[str, Any]]:
        return []

    async def prepare(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with the reset's observation as its last message (unchanged when the reset
        fails: the plays will say how)."""
        try:
            async with self._limit, asyncio.timeout(self.timeout * 2):
                first, session = await self._open(row, "audit:prepare")
                await session.close()
        except (RollgymError, TimeoutError):
            return row
        params = dict(row.get("responses_create_params") or {})
        prompt = params.get("input")
        items: list[Any] = []
        if isinstance(prompt, str):
            items = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, list):
            items = list(prompt)
        shown = orjson.dumps({"observation": first.observation}).decode()
        params["input"] = [*items, {"role": "user", "content": shown}]
        return {**row, "responses_create_params": params}

    async def play(
        self, row: dict[str, Any], answer: str, calls: Sequence[ToolCall] = (), *, last: Play
    ) -> Outcome:
        if self.field is None:
            return Outcome(refused="the action schema has no text field to put an answer in")
        if self.timeouts >= MAX_TIMEOUTS:
            return Outcome(skipped=True)
        async with self._limit:
            if self.timeouts >= MAX_TIMEOUTS:
                return Outcome(skipped=True)
            self._plays += 1
            action = {self.field: answer}
            last.endpoint = "/ws step"
            last.body = {"reset": row.get(RESET_FIELD) or {}, "action": action}
            try:
                async with asyncio.timeout(self.timeout * 3):
                    return await self._play(row, action, f"audit:{self._plays}")
            except TimeoutError:
                self.timeouts += 1
                return Outcome(crash=f"the episode took over {self.timeout * 3:g} s")
            except RollgymError as err:
                if err.type in ("read_timeout", "deadline_exceeded"):
                    self.timeouts += 1
                return Outcome(crash=f"{type(err).__name__}: {err.message[:200]}")

    async def _play(self, row: dict[str, Any], action: dict[str, Any], key: str) -> Outcome:
        _, session = await self._open(row, key)
        try:
            result = await session.step(action)
        finally:
            await session.close()
        if isinstance(result, Refused):
            return Outcome(refused=result.message[:200])
        return Outcome(reward=result.reward or 0.0)

    async def _open(self, row: dict[str, Any], key: str) -> tuple[Observation, OpenEnvSession]:
        reset = row.get(RESET_FIELD) or {}
        while True:  # bounded by the caller's timeout
            session = OpenEnvSession(self.http, self.target, key)
            try:
                return await session.open(reset if isinstance(reset, dict) else {}), session
            except CapacityReached:
                self._shrink()
                await asyncio.sleep(_FULL_WAIT)

    def _shrink(self) -> None:
        """Hold one session fewer at once (a permit taken for good), down to one."""
        if self._cap > 1:
            self._cap -= 1
            self._held.append(asyncio.ensure_future(self._limit.acquire()))

    def close(self) -> None:
        for task in self._held:
            task.cancel()


def text_field(schema: dict[str, Any]) -> str | None:
    """The action's field an answer goes in: its required text field, else its first."""
    action = schema.get("action")
    props = action.get("properties") if isinstance(action, dict) else None
    if not isinstance(action, dict) or not isinstance(props, dict):
        return None
    texts = [str(k) for k, v in props.items()
             if k != "metadata" and isinstance(v, dict) and v.get("type") == "string"]  # fmt: skip
    required = [k for k in action.get("required") or [] if k in texts]
    return str(required[0]) if required else (texts[0] if texts else None)


@asynccontextmanager
async def openenv_player(
    name: str, url: str, timeout: float, concurrency: int
) -> AsyncIterator[Player | None]:
    """An ``OpenEnvPlayer`` for the server at ``url`` if it is an OpenEnv server, else None
    (``rollgym.dialects.AUDIT_DIALECTS``)."""
    async with aiohttp.ClientSession() as http:
        schema = await _schema(http, url, timeout)
        if schema is None:
            yield None
            return
        policy = audit_policy(timeout)
        player = OpenEnvPlayer(
            http, Target.single(name, url, policy), text_field(schema), timeout, concurrency
        )
        try:
            yield player
        finally:
            player.close()


async def _schema(http: aiohttp.ClientSession, url: str, timeout: float) -> dict[str, Any] | None:
    """The server's ``GET /schema`` when it is OpenEnv's (an object with an ``action``)."""
    try:
        async with (
            asyncio.timeout(min(timeout, 10.0)),
            http.get(url.rstrip("/") + OPENENV_SCHEMA_PATH) as resp,
        ):
            if resp.status != 200:
                return None
            raw = await resp.content.read(1 << 20)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    try:
        schema = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    ok = isinstance(schema, dict) and isinstance(schema.get("action"), dict)
    return schema if ok else None
