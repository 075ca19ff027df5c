"""The OpenEnv agent: rollgym's model plays an OpenEnv environment, one session per rollout.

    connect /ws -> reset -> model -> step -> model -> step ... until done or max_steps

- The task row's ``openenv_reset`` (an object, default ``{}``) is the reset's keyword arguments
  (``seed``, ``episode_id``, or the environment's own): the row picks the episode.
- The model acts through one function tool, ``act`` (option ``tool``), whose parameters are the
  environment's action schema (its ``GET /schema``, ``metadata`` left out); each call is one
  step, its arguments the action. Its output is the step's observation (JSON) with ``reward``
  and ``done``. A turn without a call ends the episode. With option ``text_action: FIELD`` the
  model's text is the action ``{FIELD: text}`` instead, one step per turn, and each observation
  comes back as a user message.
- ``max_steps`` bounds the model's turns and the environment's steps alike: a model that puts
  many ``act`` calls in one turn gets at most ``max_steps`` of them sent in the episode; the
  rest are answered that the step budget is spent, and the episode ends truncated.
- The rollout's reward is the sum of the steps' rewards in order (a step answering ``reward:
  null`` adds nothing; ``step_rewards`` keeps the nulls). An action the environment refuses as
  invalid (``VALIDATION_ERROR``) was not applied: the model is told why, and the episode goes on.
- Failures (``rollgym.openenv.translate``): the environment's crash is its server's
  ``HTTPStatusError`` 500, a full server ``CapacityReached``, a hung step ``ReadTimeout``; the
  agent answers them 502/504 with that error as ``origin``, as for any resources server.

Capacity: an OpenEnv server holds ``max_concurrent_envs`` sessions (1 unless its app says
more). Option ``max_sessions`` makes this agent open at most that many at once (a rollout waits
for a slot at most ``session_wait`` seconds, then fails ``WaitedTooLong``); without it, a full
server's refusal is retried under its ``retry:`` policy (503) and recorded as
``capacity_reached`` when that runs out. ``max_sessions`` holds per agent process: with agent
replicas, give each its share.

The verified rollout: the row plus ``reward``, ``step_rewards``, ``num_steps`` (model calls),
``env_steps`` (actions applied), ``terminated`` (the environment said done), ``truncated``,
``observation`` (the last), ``session_attempts`` and ``response`` (the whole episode).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
from pydantic import Field

from rollgym.agents.response import final_response, function_call_output, user_message
from rollgym.agents.tool_agent import ToolCallError, tool_arguments
from rollgym.errors import (
    AnswerTooLarge,
    HTTPStatusError,
    InvalidRequest,
    ProtocolError,
    WaitedTooLong,
)
from rollgym.http import Target
from rollgym.openenv import translate
from rollgym.openenv.session import Observation, OpenEnvSession, Refused
from rollgym.protocol import function_calls, output_text, tool_error
from rollgym.server.agent import AgentServer, RunContext
from rollgym.wire import OPENENV_SCHEMA_PATH

RESET_FIELD = "openenv_reset"
"""The task row's field holding the reset's keyword arguments."""

OVER = "the episode is over; this call was not sent"
SPENT = "the episode's step budget (max_steps {}) is spent; this call was not sent"


class OpenEnvAgent(AgentServer):
    """Options: ``model``, ``resources`` (the OpenEnv server), ``max_steps``, ``tool`` or
    ``text_action``, ``max_sessions``, ``session_wait``. The OpenEnv server's ``retry:`` sets
    the connect timeout, each answer's timeout (``attempt_timeout``, per endpoint ``/reset`` and
    ``/step``), and how opening a session is retried."""

    row_fields = frozenset({RESET_FIELD})

    class Options(AgentServer.Options):
        max_steps: int = Field(
            default=10, ge=1, le=1000, description="model calls, and environment steps, per episode"
        )
        tool: str = Field(default="act", min_length=1, description="the action tool's name")
        text_action: str | None = Field(
            default=None, min_length=1, description="the action field the model's text fills"
        )
        max_sessions: int | None = Field(
            default=None, ge=1, description="sessions this agent holds open at once"
        )
        session_wait: float = Field(default=300.0, gt=0, description="seconds to wait for one")
        max_tool_argument_bytes: int = Field(default=1 << 20, ge=2)

    options: Options

    async def startup(self) -> None:
        self.model_client()
        self.peer(self.options.resources)
        # One pool for this agent's sockets; each rollout opens its own (never shared).
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._slots = (
            asyncio.Semaphore(self.options.max_sessions) if self.options.max_sessions else None
        )
        self._tool: dict[str, Any] | None = None

    async def shutdown(self) -> None:
        http = getattr(self, "_http", None)  # None: the server never started
        if http is not None:
            await http.close()
        await super().shutdown()

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        reset = row.get(RESET_FIELD, {})
        if not isinstance(reset, dict):
            raise InvalidRequest(f"task row field {RESET_FIELD!r} must be an object", status=422)
        target = self.peer(self.options.resources)
        tools = [] if self.options.text_action else [await self._action_tool(target)]
        started = time.monotonic()
        async with self._slot(target):
            session = OpenEnvSession(self._http, target, ctx.rollout)
            try:
                first = await ctx.hops.timed("seed", session.open(reset))
                episode = await self._play(row, ctx, session, first, tools)
            finally:
                await session.close()
        episode["session_attempts"] = session.attempts
        episode["agent_seconds"] = round(time.monotonic() - started, 4)
        return episode

    async def _play(
        self,
        row: dict[str, Any],
        ctx: RunContext,
        session: OpenEnvSession,
        first: Observation,
        tools: list[dict[str, Any]],
    ) -> dict[str, Any]:
        params = dict(row["responses_create_params"])
        prompt = params.get("input")
        items: list[Any] = [user_message(prompt)] if isinstance(prompt, str) else list(prompt or [])
        items.append(user_message(_show(first)))
        params["input"] = items
        if tools:
            params["tools"] = tools  # the environment's action is the only tool
        outputs: list[Any] = []
        turns: list[dict[str, Any]] = []
        rewards: list[float | None] = []
        last, done, stopped, sent = first, first.done, False, 0
        while not done and len(turns) < self.options.max_steps and sent < self.options.max_steps:
            response = await ctx.respond({**params, "input": items + outputs})
            turns.append(response)
            outputs.extend(response["output"])
            if self.options.text_action:
                result = await ctx.hops.timed(
                    "step", session.step({self.options.text_action: output_text(response)})
                )
                if isinstance(result, Refused):
                    outputs.append(user_message(result.message))
                    continue
                rewards.append(result.reward)
                last, done = result, result.done
                if not done:
                    outputs.append(user_message(_show(result)))
                continue
            calls = function_calls(response)
            if not calls:
                stopped = True  # the model stopped acting: the episode ends as it stands
                break
            for call in calls:
                if not done and sent >= self.options.max_steps:
                    text, result = tool_error(SPENT.format(self.options.max_steps)), None
                else:
                    text, result, stepped = await self._act(call, session, ctx, done)
                    sent += stepped
                outputs.append(function_call_output(str(call.get("call_id", "")), text))
                if result is not None:
                    rewards.append(result.reward)
                    last, done = result, result.done
        if not turns:
            raise ProtocolError(
                f"{session.server} answered the reset with done: the episode had no step",
                server=session.server, endpoint="/reset",
            )  # fmt: skip
        reward = sum(r for r in rewards if r is not None)
        if not math.isfinite(reward):  # each is finite (session.py); their sum may not be
            raise ProtocolError(
                f"{session.server}'s step rewards sum to {reward}, not a finite number",
                server=session.server, endpoint="/step",
            )  # fmt: skip
        return {
            **row,
            "responses_create_params": params,
            "response": final_response(turns[-1], outputs, turns),
            "reward": reward,
            "step_rewards": rewards,
            "num_steps": len(turns),
            "env_steps": len(rewards),
            "terminated": done,
            "truncated": not done and not stopped,
            "observation": last.observation,
        }

    async def _act(
        self, call: dict[str, Any], session: OpenEnvSession, ctx: RunContext, over: bool
    ) -> tuple[str, Observation | None, bool]:
        """One function call of the model: the text it gets back, the step it made, and
        whether a step was sent (a refused one was: it counts against ``max_steps``)."""
        if over:
            return tool_error(OVER), None, False
        if call.get("name") != self.options.tool:
            text = tool_error(f"unknown tool {call.get('name')!r}; use {self.options.tool!r}")
            return text, None, False
        args = tool_arguments(call.get("arguments"), self.options.max_tool_argument_bytes)
        if isinstance(args, ToolCallError):
            return tool_error(args.message), None, False
        result = await ctx.hops.timed("step", session.step(orjson.loads(args)))
        if isinstance(result, Refused):
            return tool_error(result.message), None, True
        return _show(result), result, True

    async def _action_tool(self, target: Target) -> dict[str, Any]:
        """The ``act`` function tool: the server's action schema, read once."""
        if self._tool is None:
            schema = await self._schema(target)
            action = dict(schema.get("action") or {})
            props = {k: v for k, v in (action.get("properties") or {}).items() if k != "metadata"}
            parameters: dict[str, Any] = {"type": "object", "properties": props}
            required = [r for r in action.get("required") or [] if r in props]
            if required:
                parameters["required"] = required
            if "$defs" in action:
                parameters["$defs"] = action["$defs"]
            self._tool = {
                "type": "function",
                "name": self.options.tool,
                "description": action.get("description") or "Act in the environment.",
                "parameters": parameters,
            }
        return self._tool

    async def _schema(self, target: Target) -> dict[str, Any]:
        url = target.urls[0] + OPENENV_SCHEMA_PATH
        timeout = target.policy.attempt_timeout
        limit = target.policy.answer_limits.body_bytes
        try:
            async with (
                asyncio.timeout(timeout),
                self._http.get(url) as resp,
            ):
                # Bounded as every answer is: a server can send a schema without end.
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        break
                raw = b"".join(chunks)
                status = resp.status
        except Exception as exc:
            raise translate.transport_error(
                exc, server=target.name, url=url, endpoint=OPENENV_SCHEMA_PATH, timeout=timeout
            ) from exc
        if len(raw) > limit:
            raise AnswerTooLarge(
                f"{target.name} sent a {OPENENV_SCHEMA_PATH} over {limit} bytes "
                "(retry.answer_limits.body_bytes)",
                server=target.name, url=url, endpoint=OPENENV_SCHEMA_PATH, method="GET",
                retryable=False,
            )  # fmt: skip
        if status != 200:
            raise HTTPStatusError(
                f"{target.name} answered GET {OPENENV_SCHEMA_PATH} with {status}",
                status=status, body=raw, server=target.name, endpoint=OPENENV_SCHEMA_PATH,
            )  # fmt: skip
        try:
            schema = orjson.loads(raw)
        except orjson.JSONDecodeError:
            schema = None
        if not isinstance(schema, dict):
            raise ProtocolError(
                f"{target.name}: {OPENENV_SCHEMA_PATH} is not a JSON object",
                body=raw, server=target.name, endpoint=OPENENV_SCHEMA_PATH,
            )  # fmt: skip
        return schema

    @asynccontextmanager
    async def _slot(self, target: Target) -> AsyncIterator[None]:
        """One of this agent's ``max_sessions`` (waiting at most ``session_wait``)."""
        if self._slots is None:
            yield
            return
        try:
            async with asyncio.timeout(self.options.session_wait):
                await self._slots.acquire()
        except TimeoutError:
            raise WaitedTooLong(
                f"no free session on {target.name} within {self.options.session_wait:g}s "
                f"(max_sessions {self.options.max_sessions} of {self.name})",
                server=target.name, endpoint="/ws", retryable=True,
            ) from None  # fmt: skip
        try:
            yield
        finally:
            self._slots.release()


def _show(result: Observation) -> str:
    """A step's answer as the model reads it."""
    return orjson.dumps(
        {"observation": result.observation, "reward": result.reward, "done": result.done}
    ).decode()
