"""rollgym environments for prime-rl, through Prime Intellect's ``verifiers`` 0.4 (v1).

prime-rl trains on verifiers environments: a ``Taskset`` (the rows, setup and the reward) played
by a harness (the agent program), whose model calls verifiers intercepts and sends to the
trainer's inference server itself, keeping the token ids and logprobs it trains on. So a rollgym
environment reaches prime-rl as a Taskset whose parts call the rollgym resources server:

- each row of a rollgym task file (``responses_create_params`` + environment fields) is one task;
  its prompt is the row's ``input``;
- task setup opens the rollout's own session (``/seed_session``), one per rollout, never shared;
- the tools are the server's tools (the row's ``tools``, else ``GET /tools``), served to the
  harness over MCP by a taskset-wide tool server that calls ``POST /<tool>`` in the calling
  rollout's session (its ``x-rollgym-session`` and cookies travel in verifiers' rollout state);
- the reward is the verify response's ``reward`` (``/verify`` with the row and the rollout as a
  Responses API response); its other numeric fields become trace metrics.

A failure is never a reward of 0. Where rollgym fails (seed, a tool's server, verify, or a verify
response that is malformed or says ``mask_sample: true``), the task hook raises the typed
``RollgymError``; verifiers records it on the trace as a ``TaskError`` (``trace.ok`` false, the
reward entry ``None``: "scoring didn't run"), and the error's plain fields are kept in
``trace.info["rollgym_error"]``. A tool whose server fails answers the model with an error result
and marks the rollout failed; the rollout stops before its next model call and its scoring
raises that error. A tool's own refusal (a 4xx) is the tool's answer, as in rollgym's agent.
A rollout sends at most ``max_tool_calls`` tool calls (its episode's budget, as in rollgym's
agent; the count travels in the rollout state): a call past them is answered, never sent, and
the rollout stops before its next model call.

This module is pure (no verifiers import): the conversions, the checks and the tool call
(``call_tool`` on the rollout state), tested in the normal suite.
``rollgym.integrations.verifiers_taskset`` holds the verifiers classes.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollgym.config import RetryPolicy, kind_defaults
from rollgym.errors import ConfigError, InputError, ProtocolError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.nemo_gym.mask import mask_sample
from rollgym.protocol import is_tool_name
from rollgym.server.episode import Episode, ResourcesClient
from rollgym.wire import INDEX_FIELDS

__all__ = [
    "TASKSET_MODULE",
    "Verdict",
    "bundled_dataset",
    "call_tool",
    "failure_fields",
    "load_rows",
    "mcp_tools",
    "recorded_failure",
    "verdict",
]

TASKSET_MODULE = "rollgym.integrations.verifiers_taskset"
"""The module holding the verifiers classes (imports verifiers)."""

NOT_METRICS = INDEX_FIELDS | {"reward"}


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a verify response says, checked: the reward, the numeric metrics beside it, and
    the rest of its fields (without the row's prompt and the response)."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def verdict(verified: Any, *, server: str | None = None) -> Verdict:
    """The checked verdict of a ``/verify`` answer. ``ProtocolError`` (blaming ``server``) when
    it is no object, its reward is missing, not a number, or not finite, or it asks to be
    masked (``mask_sample: true``: the environment says the reward is no measurement, so it
    must not be trained on as one)."""
    if not isinstance(verified, dict):
        raise ProtocolError(
            "verify answered something other than a JSON object", server=server,
            endpoint="/verify", body=_shown(verified),
        )  # fmt: skip
    reward = verified.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise ProtocolError(
            f"verify response has no numeric reward (reward: {_shown(reward).decode()})",
            server=server, endpoint="/verify", body=_shown(verified),
        )  # fmt: skip
    if _finite(reward) is None:
        raise ProtocolError(
            f"verify response has a reward of {reward!r}", server=server, endpoint="/verify",
            body=_shown(verified),
        )  # fmt: skip
    if mask_sample(verified, server=server):
        raise ProtocolError(
            "verify response says mask_sample: true (the environment's reward is no "
            "measurement); the rollout is recorded as failed, not scored",
            server=server, endpoint="/verify", body=_shown(verified),
        )  # fmt: skip
    metrics = {
        k: value
        for k, v in verified.items()
        if k not in NOT_METRICS
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (value := _finite(v)) is not None
    }
    info = {
        k: v
        for k, v in verified.items()
        if k not in ("responses_create_params", "response", "reward")
    }
    return Verdict(float(reward), metrics, info)


def mcp_tools(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """A row's (or ``GET /tools``'s) Responses API function tools as MCP tool specs
    (``name``, ``description``, ``input_schema``). Tools that are not functions, and names
    that are no tool of a rollgym server (``rollgym.protocol.is_tool_name``: ``verify``,
    ``seed_session``, ``_session``, a lookalike, ...), are left out: a model must not reach
    those endpoints by naming them, and the episode would refuse such a call anyway."""
    specs: dict[str, dict[str, Any]] = {}
    for tool in tools:
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        assert isinstance(fn, Mapping)
        name = fn.get("name")
        if not is_tool_name(name):
            continue
        schema = fn.get("parameters")
        description = fn.get("description")
        specs.setdefault(
            name,
            {
                "name": name,
                "description": description if isinstance(description, str) else None,
                "input_schema": dict(schema)
                if isinstance(schema, Mapping)
                else {"type": "object", "properties": {}},
            },
        )
    return list(specs.values())


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """The task rows of a rollgym task file: one JSON object a line, each with a
    ``responses_create_params`` object holding ``input``. ``InputError`` naming the file and
    line for a malformed one; ``ConfigError`` for a missing or empty file."""
    source = Path(path).expanduser()
    try:
        lines = source.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read task file {source}: {exc.strerror or exc}") from None
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"{where}: not JSON ({exc})") from None
        params = row.get("responses_create_params") if isinstance(row, dict) else None
        if not isinstance(params, dict) or "input" not in params:
            raise InputError(f"{where}: a task row needs responses_create_params.input")
        rows.append(row)
    if not rows:
        raise ConfigError(f"task file {source} has no rows")
    return rows


def bundled_dataset(env: str) -> Path:
    """The example task file of a bundled environment (``lookup``, ``mcqa``, ...)."""
    root = Path(__file__).resolve().parent.parent / "envs"
    path = root / env / "data" / "example.jsonl"
    if not env.isidentifier() or not path.is_file():
        known = sorted(p.parent.parent.name for p in root.glob("*/data/example.jsonl"))
        raise ConfigError(f"no bundled environment {env!r} with example data (known: {known})")
    return path


# -- the tool calls: rollgym's client side, one per event loop (the host's and the tool server's)

_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpClient] = (
    weakref.WeakKeyDictionary()
)
_resources: dict[tuple[int, str, str, float, float], ResourcesClient] = {}


def rollout_episode(state: Any, verify_timeout: float = 300.0) -> Episode:
    """The episode of the rollout whose verifiers state is ``state`` (a ``RollgymState``): its
    session id, its own cookie jar (a copy: the state is written back whole) and its tool-call
    budget, as far as the state says it is spent."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = HttpClient()
    key = (id(pool), state.server, state.resources_url, state.tool_timeout, verify_timeout)
    client = _resources.get(key)
    if client is None or client.http is not pool:
        policy = RetryPolicy.model_validate(kind_defaults("resources"))
        target = Target.single(state.server, state.resources_url, policy)
        client = _resources[key] = ResourcesClient(
            pool, target, tool_timeout=state.tool_timeout, verify_timeout=verify_timeout
        )
    episode = client.episode(state.rollout)
    episode.session_id = state.session_id
    episode.cookies = dict(state.cookies)
    episode.max_tool_calls = state.max_tool_calls
    episode.tool_calls = state.tool_calls_taken
    return episode


async def call_tool(state: Any, name: str, arguments: Any) -> tuple[str, bool]:
    """One MCP tool call of the rollout whose verifiers state is ``state``: the text the model
    gets, and whether it is an error result. A tool's refusal (a 4xx) is its answer; a failing
    server marks the state ``failure``; a call past the rollout's ``max_tool_calls`` is answered
    ``rollgym.server.episode.SPENT``, never sent, and marks it ``calls_spent`` (both stop the
    rollout before its next model call). verifiers writes a tool server's state back whole,
    last write wins: its chat loop makes a message's calls one after the other."""
    if state.failure is not None:
        return "this rollout has already failed; no more tool calls", True
    if name not in {spec["name"] for spec in state.tools}:
        return f"unknown tool {name!r}", True
    episode = rollout_episode(state)
    taken = episode.tool_calls
    try:
        output = await episode.call_tool(name, arguments)
    except RollgymError as err:
        # The server failed (not the tool refusing): the rollout is lost, and says why.
        state.failure = failure_fields(err)
        return f"tool {name!r} failed: {err.message}", True
    finally:
        state.cookies = dict(episode.cookies)
        state.tool_calls_taken = episode.tool_calls
    if episode.tool_calls == taken:  # the budget refused it: nothing was sent
        state.calls_spent = True
        return output, True
    state.tool_calls = [*state.tool_calls, name]
    return output, False


def failure_fields(error: RollgymError) -> dict[str, Any]:
    """``error`` as the plain dict verifiers' rollout state and ``trace.info`` carry."""
    return error.to_dict()


def recorded_failure(fields: Any) -> RollgymError:
    """The error a rollout state recorded (``failure_fields``); a record that is not one is
    itself a ``ProtocolError`` (the state is shared with the tool server process)."""
    if isinstance(fields, dict) and isinstance(fields.get("type"), str):
        try:
            return RollgymError.from_dict(fields)
        except (KeyError, TypeError, ValueError):
            pass
    return ProtocolError(f"unreadable tool failure record in the rollout state: {fields!r:.200}")


def _finite(value: int | float) -> float | None:
    """``value`` as a finite float, or None (NaN, infinite, or an int past float's range)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(value: Any) -> bytes:
    try:
        return orjson.dumps(value)[:2000]
    except TypeError:
        return type(value).__name__.encode()
