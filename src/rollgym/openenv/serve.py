"""Any rollgym environment as an OpenEnv environment: openenv-core's own server (its ``/ws``,
``/reset``, ``/step``, ``/state``, ``/schema``, ``/health``) in front of a rollgym resources
server, so OpenEnv's clients and TRL's OpenEnv path (``environment_factory``) can use it.

One OpenEnv session is one rollgym session (``/seed_session``) of its own:

- ``reset(**row)`` with a task row (``responses_create_params`` and the environment's fields),
  or ``reset(task_index=i)`` / ``reset(seed=s)`` picking row ``i`` / ``s mod n`` of the tasks
  served (``rollgym serve-openenv``'s ``collect.input``). A row carries its own answer key: a
  caller who sends one chooses what is paid, so rows are refused unless the server is told to
  trust its callers as it trusts the trainer's dataset (``--accept-rows``, ``rows=True``). The
  observation carries the task's ``prompt`` (its ``input``) and ``tools`` (the row's, else the
  server's ``/tools``).
- A session is closed (``/close_session``) when its OpenEnv session ends, when it is reset
  again before an answer, and after each stateless HTTP ``/reset``: an abandoned episode holds
  nothing on the rollgym server.
- ``step({"tool": NAME, "arguments": {...}})`` calls one of those tools in the session; the
  observation's ``output`` is its answer (a tool not offered is refused, never sent: a client
  cannot reach ``/verify`` or ``/seed_session`` by naming them). ``reward`` is null. An
  episode sends at most ``max_tool_calls`` calls (default 256, the episode's budget as in
  rollgym's agent): a step past them answers that they are spent and sends nothing.
- ``step({"answer": TEXT})`` ends the episode: the episode so far (each tool call and its output,
  then ``TEXT`` as the assistant's message) is one Responses API response, scored by the
  server's ``/verify``; ``reward`` is its reward, ``done`` true, ``verified`` its numbers
  and flags (``shown_verdict``: no texts or structures, which may tell the answer key).
  A verdict the server masks (``mask_sample``: no measurement, e.g. a scorer's worker lost)
  answers ``reward`` null with ``verified.mask_sample`` true: a 0 would be a score nobody gave.

A failure of the rollgym server (a 5xx, a timeout) fails that step: openenv-core answers it
``EXECUTION_ERROR`` with the rollgym error's text. Sessions past ``max_concurrent_envs`` are
refused by openenv-core (``CAPACITY_REACHED``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from rollgym.errors import RollgymError
from rollgym.http import HttpClient, Target
from rollgym.openenv.host import QuietClose
from rollgym.protocol import tool_error
from rollgym.server.episode import MAX_TOOL_CALLS, Episode, ResourcesClient
from rollgym.wire import CLOSE_SESSION_ENDPOINT, MASK_SAMPLE

log = logging.getLogger("rollgym.openenv")


def shown_verdict(verified: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """What the client sees of a verdict: its numbers and flags (metrics, ``mask_sample``), not
    the row's own fields, the response, texts or anything structured. A verdict's texts may
    tell the answer key: a judge's evaluations quote the reference, and a guard's reason can
    say which names the reference holds or how long it is; a client that replays the task
    (``reset(task_index=i)``) would read it before answering again."""
    return {
        key: value
        for key, value in verified.items()
        if key not in ("response", "reward")
        and key not in row
        and (value is None or isinstance(value, (bool, int, float)))
    }


class RollgymAction(Action):  # type: ignore[misc]
    """Call a tool (``tool`` + ``arguments``) or answer (``answer``): exactly one (checked in
    the step: openenv-core 0.3.0 cannot report a validator's own error and ends the session)."""

    tool: str | None = Field(default=None, description="a tool the task offers")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments")
    answer: str | None = Field(default=None, description="the final answer: ends the episode")


class RollgymObservation(Observation):  # type: ignore[misc]
    prompt: Any = Field(default=None, description="reset: the task's input")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="reset: its tools")
    output: str | None = Field(default=None, description="a tool's output")
    verified: dict[str, Any] | None = Field(default=None, description="the answer's verdict")


class Link:
    """What every session of one app shares: the rollgym server and its client, the tasks."""

    def __init__(
        self,
        target: Target,
        tasks: list[dict[str, Any]],
        timeout: float,
        rows: bool = False,
        max_tool_calls: int = MAX_TOOL_CALLS,
    ) -> None:
        self.target, self.tasks, self.timeout, self.rows = target, tasks, timeout, rows
        self.max_tool_calls = max_tool_calls
        self._client: ResourcesClient | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        if self._closing:  # sessions being closed finish first, with the client they use
            await asyncio.gather(*self._closing, return_exceptions=True)
        if self._client is not None:
            await self._client.http.close()

    def release(self, episode: Episode, loop: asyncio.AbstractEventLoop) -> None:
        """Close ``episode``'s session on ``loop`` (the server's), without waiting: called
        from openenv-core's synchronous ``close``, on that loop or in a worker thread."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._spawn(episode)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._spawn, episode)

    def _spawn(self, episode: Episode) -> None:
        task = asyncio.get_running_loop().create_task(self.close_session(episode))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close_session(self, episode: Episode) -> None:
        """``/close_session`` for ``episode``'s session (unnamed: its header names it)."""
        body = {"resources_session_id": "", "episode_id": {"rollout_id": "openenv"}}
        try:
            await episode.post(CLOSE_SESSION_ENDPOINT, body, self.timeout)
        except RollgymError as err:  # the server drops it later by its own bounds
            log.warning("%s: closing an abandoned session failed: %s", self.target.name, err)

    def episode(self, rollout: str) -> Episode:
        if self._client is None:  # made in the server's loop, at the first session
            self._client = ResourcesClient(
                HttpClient(), self.target, tool_timeout=self.timeout, verify_timeout=self.timeout
            )
        episode = self._client.episode(rollout)
        episode.max_tool_calls = self.max_tool_calls
        return episode


class RollgymEnvironment(Environment):  # type: ignore[misc]
    """One OpenEnv session on a rollgym resources server."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each instance holds a rollgym session of its own

    def __init__(self, link: Link) -> None:
        super().__init__()
        self.link = link
        self._state = State(episode_id=None, step_count=0)
        self._episode: Episode | None = None
        self._row: dict[str, Any] = {}
        self._tools: list[dict[str, Any]] = []
        self._items: list[dict[str, Any]] = []
        self._done = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        """openenv-core's end of a session (a closed socket, each HTTP ``/reset``): the
        rollgym session of an episode never answered is closed."""
        episode, self._episode = self._episode, None
        if episode is not None and not self._done and self._loop is not None:
            self.link.release(episode, self._loop)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw: Any) -> Any:
        raise NotImplementedError("served asynchronously: reset_async")

    def step(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
        raise NotImplementedError("served asynchronously: step_async")

    @property
    def state(self) -> State:
        return self._state

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **row: Any
    ) -> RollgymObservation:
        row = self._task(seed, row)
        if self._episode is not None and not self._done:  # reset before the answer
            previous, self._episode = self._episode, None
            await self.link.close_session(previous)
        self._loop = asyncio.get_running_loop()
        rollout = episode_id or os.urandom(16).hex()
        episode = self.link.episode(rollout)
        await episode.seed(row)
        params = row["responses_create_params"]
        tools = params.get("tools") or await episode.tools()
        self._episode, self._row, self._tools = episode, row, list(tools)
        self._items, self._done = [], False
        self._state = State(episode_id=rollout, step_count=0)
        return RollgymObservation(prompt=params.get("input"), tools=self._tools)

    async def step_async(
        self, action: RollgymAction, timeout_s: float | None = None, **kw: Any
    ) -> RollgymObservation:
        if self._episode is None or self._done:
            raise RuntimeError("no episode: reset first (an answered episode is over)")
        if (action.tool is None) == (action.answer is None):
            return RollgymObservation(output=tool_error("give either 'tool' or 'answer'"))
        self._state.step_count += 1
        if action.answer is not None:
            return await self._answer(self._episode, action.answer)
        names = {t.get("name") for t in self._tools}
        if action.tool not in names:
            return RollgymObservation(
                output=tool_error(
                    f"unknown tool {action.tool!r} (offered: {sorted(map(str, names))})"
                )
            )
        assert action.tool is not None
        output = await self._episode.call_tool(action.tool, action.arguments)
        call_id = f"call_{os.urandom(8).hex()}"
        self._items += [
            {
                "type": "function_call", "id": f"fc_{call_id}", "call_id": call_id,
                "name": action.tool, "arguments": orjson.dumps(action.arguments).decode(),
                "status": "completed",
            },
            {
                "type": "function_call_output", "id": f"fco_{call_id}", "call_id": call_id,
                "output": output, "status": "completed",
            },
        ]  # fmt: skip
        return RollgymObservation(output=output)

    async def _answer(self, episode: Episode, text: str) -> RollgymObservation:
        message = {
            "type": "message", "id": f"msg_{os.urandom(8).hex()}", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }  # fmt: skip
        response = {
            "id": f"resp_{os.urandom(8).hex()}", "object": "response",
            "created_at": int(time.time()), "model": "openenv-client", "status": "completed",
            "output": [*self._items, message], "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": self._tools,
        }  # fmt: skip
        verified = await episode.verify(self._row, response)
        self._done = True
        reward = None if verified.get(MASK_SAMPLE) else verified.get("reward")
        return RollgymObservation(
            reward=reward, done=True, verified=shown_verdict(verified, self._row)
        )

    def _task(self, seed: int | None, row: dict[str, Any]) -> dict[str, Any]:
        if "responses_create_params" in row:
            if not self.link.rows:
                # The caller's row carries its own expected answer: served tasks only.
                raise ValueError(
                    "this server scores its own tasks only: reset(task_index=i) or reset(seed=s) "
                    "(serve-openenv --accept-rows takes callers' rows)"
                )
            return row
        tasks = self.link.tasks
        index = row.pop("task_index", None)
        if row:
            raise ValueError(f"reset takes a task row, task_index or seed; not {sorted(row)}")
        if not tasks:
            raise ValueError("reset needs a task row (no tasks are served to pick from)")
        if isinstance(index, int) and not isinstance(index, bool):
            if not 0 <= index < len(tasks):
                raise ValueError(f"task_index {index} is not in 0..{len(tasks) - 1}")
            return tasks[index]
        if seed is not None:
            return tasks[seed % len(tasks)]
        raise ValueError("reset needs a task row, a task_index or a seed")


def openenv_app(
    target: Target,
    *,
    tasks: list[dict[str, Any]] | None = None,
    max_concurrent_envs: int = 64,
    timeout: float = 300.0,
    rows: bool = False,
    max_tool_calls: int = MAX_TOOL_CALLS,
) -> Any:
    """openenv-core's app serving rollgym resources server ``target`` (its tools' and verify's
    calls each within ``timeout`` seconds, retried per ``target.policy``). ``reset`` takes
    ``task_index``/``seed`` into ``tasks``; with ``rows=True`` also a task row of the caller's
    (a row names its own expected answer: only for callers trusted to choose the answer key,
    as a trainer's own dataset is). An episode sends at most ``max_tool_calls`` tool calls."""
    link = Link(target, list(tasks or []), timeout, rows, max_tool_calls)
    factory: Callable[[], RollgymEnvironment] = lambda: RollgymEnvironment(link)  # noqa: E731
    app = create_app(
        factory, RollgymAction, RollgymObservation, env_name=target.name,
        max_concurrent_envs=max_concurrent_envs,
    )  # fmt: skip
    app.router.on_shutdown.append(link.close)
    app.add_middleware(QuietClose)  # no traceback when a client closes first (QuietClose)
    return app
