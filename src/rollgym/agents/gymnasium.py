"""The Gymnasium-style agent: ``/reset`` + ``/step`` environments under rollgym.

    /reset -> model -> /step -> model -> /step ... until terminated, truncated or max_steps

The protocol is NeMo Gym 0.4's (``resources_servers/gymnasium`` and its ``gymnasium_agent``):

- ``POST /reset`` takes the task row and answers ``{"observation": str | null, "info": {}}``;
  an observation is appended to the prompt as a user message (a string prompt becomes a list).
- Each step, the model answers the prompt plus every item so far; ``POST /step`` takes the task
  row plus ``"response"`` (that model response) and answers ``{"observation", "reward",
  "terminated", "truncated", "info"}``. Unless the episode ended, ``info["tool_outputs"]``
  (``[{"call_id", "output"}]``) become ``function_call_output`` items and the observation a
  user message, for the next model call.
- The reward is the sum of the step rewards, in order. An episode still running after
  ``max_steps`` model calls is ``truncated``.
- The session lives in a cookie the server sets, carried on every call of this rollout only.

It takes no turns (``AgentServer.turn``: a turn is a model-and-tools loop on granted tool
routes, and this agent's episode is ``/reset`` + ``/step`` on its own server, which scores as it
goes). Its ``/run`` takes the dialects' bodies like any agent's (``rollgym.dialects``).

The verified rollout is the task row plus ``reward``, ``step_rewards``, ``num_steps``,
``terminated``, ``truncated``, ``info`` (the last step's), ``responses_create_params`` with the
prompt the model saw first (the reset observation included), and ``response``: the last model
response whose ``output`` is the whole episode, model items and the environment's items (user
messages, tool outputs) in order.

Where rollgym is stricter: a ``/step`` answer must carry ``reward``, ``terminated`` and
``truncated`` with the right types (a missing one is a ``protocol_error``, never taken as 0 or
false), and keys of an answer outside the protocol are logged as a warning (an old-style ``done``
would otherwise be ignored quietly).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, NoReturn

import orjson
from pydantic import Field

from rollgym.agents.response import final_response, function_call_output, user_message
from rollgym.errors import ProtocolError
from rollgym.protocol import RESET_KEYS, STEP_KEYS, Reset, Step, ToolOutput
from rollgym.server.agent import AgentServer, Hops, RunContext
from rollgym.server.episode import ResourcesClient

log = logging.getLogger(__name__)

_warned: set[tuple[str, str, str]] = set()  # (server, endpoint, key): warn once per process


class GymEpisode:
    """One rollout's session on a Gymnasium-style server: ``reset`` once, then ``step``.

    Through an ``Episode``, it sends the rollout id and every cookie the server has set, on this
    rollout's calls only, pinned to the replica that holds the session once it has one.
    """

    def __init__(self, resources: ResourcesClient, rollout: str, hops: Hops | None = None) -> None:
        self.resources = resources
        self.session = resources.episode(rollout)  # the session protocol: rollout id, cookies
        self.hops = hops or Hops()
        """Times ``/reset`` as the ``seed`` hop and each ``/step`` as a ``step`` one (so a
        failed episode says where it failed)."""

    @property
    def server(self) -> str:
        return self.resources.target.name

    async def reset(self, row: dict[str, Any]) -> Reset:
        """Start the episode for task ``row``."""
        reset: Reset = await self.hops.timed("seed", self._reset(row))
        return reset

    async def step(self, row: dict[str, Any], response: dict[str, Any]) -> Step:
        """Act with the model's ``response``. Uses ``verify_timeout``: a step may score."""
        step: Step = await self.hops.timed("step", self._step(row, response))
        return step

    async def _reset(self, row: dict[str, Any]) -> Reset:
        answer = await self.session.post("/reset", row, self.resources.tool_timeout)
        return parse_reset(answer, self.server)

    async def _step(self, row: dict[str, Any], response: dict[str, Any]) -> Step:
        answer = await self.session.post(
            "/step", {**row, "response": response}, self.resources.verify_timeout
        )
        return parse_step(answer, self.server)


class GymnasiumAgent(AgentServer):
    """Options: ``model`` and ``resources`` (server names), ``max_steps`` (model calls, default
    10), ``model_timeout``; ``tool_timeout`` bounds ``/reset`` and
    ``verify_timeout`` each ``/step``."""

    class Options(AgentServer.Options):
        max_steps: int = Field(default=10, ge=1, le=1000, description="model calls per episode")

    options: Options

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        episode = GymEpisode(self.resources_client(), ctx.rollout, ctx.hops)
        started = time.monotonic()
        reset = await episode.reset(row)

        params = dict(row["responses_create_params"])
        prompt = params.get("input")
        items: list[Any] = [user_message(prompt)] if isinstance(prompt, str) else list(prompt or [])
        if reset.observation:
            items.append(user_message(reset.observation))
        params["input"] = items

        outputs: list[Any] = []
        turns: list[dict[str, Any]] = []
        rewards: list[float] = []
        step: Step | None = None
        total = 0.0
        while len(turns) < self.options.max_steps:
            response = await ctx.respond({**params, "input": items + outputs})
            turns.append(response)
            outputs.extend(response["output"])
            step = await episode.step(row, response)
            rewards.append(step.reward)
            total += step.reward  # summed in step order from 0.0
            if step.terminated or step.truncated:
                break  # a final step's observation and tool outputs go to nobody
            outputs.extend(function_call_output(t.call_id, t.output) for t in step.tool_outputs)
            if step.observation:
                outputs.append(user_message(step.observation))
        assert step is not None  # max_steps >= 1
        ended = step.terminated or step.truncated
        return {
            **row,
            "responses_create_params": params,
            "response": final_response(turns[-1], outputs, turns),
            "reward": total,
            "step_rewards": rewards,
            "num_steps": len(turns),
            "terminated": step.terminated,
            "truncated": step.truncated or not ended,
            "info": step.info,
            "agent_seconds": round(time.monotonic() - started, 4),
        }


def parse_reset(answer: Any, server: str) -> Reset:
    """A ``/reset`` answer as a ``Reset``, or a ``ProtocolError`` naming what is wrong."""
    body = _object(answer, server, "/reset")
    _warn_unknown(body, RESET_KEYS, server, "/reset")
    return Reset(
        observation=_observation(body, server, "/reset"), info=_info(body, server, "/reset")
    )


def parse_step(answer: Any, server: str) -> Step:
    """A ``/step`` answer as a ``Step``, or a ``ProtocolError`` naming what is wrong."""
    body = _object(answer, server, "/step")
    _warn_unknown(body, STEP_KEYS, server, "/step")
    reward = body.get("reward")
    if not (
        isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)
    ):
        _fail(f"/step answered reward {reward!r}, not a finite number", body, server, "/step")
    flags = {}
    for key in ("terminated", "truncated"):
        if not isinstance(body.get(key), bool):
            _fail(f"/step answered {key} {body.get(key)!r}, not true/false", body, server, "/step")
        flags[key] = bool(body[key])
    info = _info(body, server, "/step")
    return Step(
        observation=_observation(body, server, "/step"),
        reward=float(reward),
        terminated=flags["terminated"],
        truncated=flags["truncated"],
        info=info,
        tool_outputs=_tool_outputs(info, body, server),
    )


def _object(answer: Any, server: str, endpoint: str) -> dict[str, Any]:
    if not isinstance(answer, dict):
        _fail(f"{endpoint} answered something other than a JSON object", answer, server, endpoint)
    return answer


def _observation(body: dict[str, Any], server: str, endpoint: str) -> str | None:
    observation = body.get("observation")
    if observation is not None and not isinstance(observation, str):
        _fail(f"{endpoint} answered a non-string observation", body, server, endpoint)
    return observation


def _info(body: dict[str, Any], server: str, endpoint: str) -> dict[str, Any]:
    info = body.get("info")
    if info is None:
        return {}
    if not isinstance(info, dict):
        _fail(f"{endpoint} answered info {info!r}, not an object", body, server, endpoint)
    return info


def _tool_outputs(info: dict[str, Any], body: Any, server: str) -> tuple[ToolOutput, ...]:
    raw = info.get("tool_outputs")
    if raw is None:
        return ()
    ok = isinstance(raw, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("call_id"), str)
        and isinstance(t.get("output"), str)
        for t in raw
    )
    if not ok:
        _fail(
            'info.tool_outputs must be a list of {"call_id": str, "output": str}',
            body, server, "/step",
        )  # fmt: skip
    return tuple(ToolOutput(t["call_id"], t["output"]) for t in raw)


def _warn_unknown(body: dict[str, Any], known: frozenset[str], server: str, endpoint: str) -> None:
    for key in sorted(set(body) - known):
        if (server, endpoint, key) not in _warned:
            _warned.add((server, endpoint, key))
            log.warning(
                "%s %s answered key %r, which the Gymnasium protocol does not define: ignored "
                "(only %s count)", server, endpoint, key, ", ".join(sorted(known)),
            )  # fmt: skip


def _fail(message: str, body: Any, server: str, endpoint: str) -> NoReturn:
    raise ProtocolError(message, server=server, endpoint=endpoint, body=orjson.dumps(body))
