"""The tool-calling agent: ``POST /run`` turns one task row into one verified rollout.

    seed_session -> model -> tool calls -> model -> ... (at most max_steps model calls) -> verify

The loop in the middle is also the agent's ``turn``: the same loop, its tools called on the
resources its caller granted, answering the turn's response unverified (a dialect's endpoints
drive it; ``rollgym.dialects`` lists them).

A rollout that runs out of steps is verified as it stands and marked ``truncated``.

Tool calls are bounded too, as ``max_steps`` bounds model calls: a model message runs at most
``max_tool_calls_per_message`` of its calls (default 64) and a rollout at most
``max_tool_calls`` (default 256; in an agent session, per turn, as ``max_steps``); the calls
past either are answered with a tool error and never sent. A message whose calls find the
rollout's calls spent ends the loop there, ``truncated``, as running out of steps does. The
rollout's count is its episode's (``rollgym.server.episode``), the budget every path that runs
a model's tool calls draws on.

When its model server attaches training token data (``openai_proxy``'s ``return_token_ids``),
the rollout records ``drifted_turns``: how many calls' prompts do not extend the previous call's
prompt and generation (``rollgym.models.tokens``), with the details under ``rollgym_drift``.

A tool's own 4xx answer (bad arguments, unknown key) is the tool's output, handed back to the
model as a ``function_call_output``. So is a call the agent will not pass on: a tool the task does
not declare (or a name that is no tool: a reserved endpoint such as ``verify``, ``__init__``, a
lookalike; ``rollgym.protocol.is_tool_name``), a call past the caps, arguments that are not a
JSON object, are larger than ``max_tool_argument_bytes`` or nested deeper than JSON can be written again
(orjson reads 1,024 levels, writes 255): model output never fails the rollout by itself. The
names of undeclared tools it called are kept in the record (``rollgym_undeclared_tools``) and
the collector warns about them: NeMo Gym's ``simple_agent`` sends such a call to the resources
server, so the same row can pay there and not here. An infrastructure failure (model, tool or verify failing
after the called server's retries) fails the rollout with the typed error as ``origin``.
If the caller disconnects, the rollout is cancelled with the requests it has in flight, so
nobody keeps a broken upstream under load for work nobody will read.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import Field

from rollgym.agents.response import final_response, function_call_output
from rollgym.models.tokens import DRIFT_FIELD, DRIFTED_TURNS, CallTokens, drifted_turns
from rollgym.protocol import function_calls, is_tool_name, tool_error
from rollgym.server.agent import AgentServer, RunContext
from rollgym.server.episode import MAX_TOOL_CALLS, NOT_RUN, SPENT, Episode

UNDECLARED_TOOLS = "rollgym_undeclared_tools"
"""A verified rollout's tool names that its model called but its row does not declare (the
agent refused those calls): at most ``UNDECLARED_SHOWN``, sorted; absent when there were none."""
UNDECLARED_SHOWN = 16


class ToolAgent(AgentServer):
    """Options: ``model`` and ``resources`` (server names), ``max_steps`` (default 10),
    ``max_tool_calls_per_message`` (64), ``max_tool_calls`` (256), ``model_timeout``,
    ``tool_timeout``, ``verify_timeout`` (seconds, per call),
    ``model_pause_s`` (seconds a model call may be held by a pause, beyond its timeout),
    ``tools_from_server`` (default false)."""

    class Options(AgentServer.Options):
        # At least one: zero steps would "verify" a response the model never gave.
        max_steps: int = Field(default=10, ge=1, le=1000)
        # A row's tools are its ``responses_create_params.tools`` (an environment may have
        # no ``/tools``: 404). Offering a rollgym environment's tools to rows
        # that declare none is a choice the config makes, never a guess.
        tools_from_server: bool = Field(
            default=False,
            description="give rows without tools the resources server's tools (GET /tools)",
        )
        max_tool_argument_bytes: int = Field(
            default=1 << 20, ge=2, description="a tool call's arguments past this are refused"
        )
        # A model message can hold any number of calls; each sent one costs the environment
        # a request (10,000 in one message were all run before these caps).
        max_tool_calls_per_message: int = Field(
            default=64, ge=1, description="a message's tool calls past this are refused"
        )
        max_tool_calls: int = Field(
            default=MAX_TOOL_CALLS,
            ge=1,
            description="tool calls per rollout (per turn in an agent session); past this the "
            "calls are refused and the rollout ends truncated",
        )

    options: Options

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        """Run one rollout of ``row`` and return the verify response."""
        episode = ctx.episode()
        await episode.seed(row)
        turn = await self.loop(row["responses_create_params"], episode, ctx)
        verified = await episode.verify(row, turn.response)
        verified.update(drift_fields(turn.turns))
        verified.setdefault("num_steps", turn.steps)
        verified.setdefault("truncated", turn.truncated)
        verified.setdefault("agent_seconds", turn.seconds)
        if turn.undeclared:
            # Said in the record, so the collector can warn: refused, they may cost a reward an
            # agent that sends any call to the resources server would be paid.
            verified.setdefault(UNDECLARED_TOOLS, sorted(turn.undeclared)[:UNDECLARED_SHOWN])
        return verified

    async def turn(self, params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        """One agent-session turn: the same loop on the granted resources, unverified."""
        return (await self.loop(params, ctx.episode(), ctx)).response

    async def loop(self, params: dict[str, Any], episode: Episode, ctx: RunContext) -> Turn:
        """Model -> tool calls -> model ... on create params ``params`` (at most ``max_steps``
        model calls), the tools called within ``episode``; the whole turn as one response."""
        params = dict(params)
        raw_input = params.get("input")
        items: list[Any] = (
            [{"type": "message", "role": "user", "content": raw_input}]
            if isinstance(raw_input, str)
            else list(raw_input or [])
        )
        if not params.get("tools") and self.options.tools_from_server:
            tools = await episode.tools()
            if tools:
                params["tools"] = tools
        declared = _tool_names(params.get("tools"))
        undeclared: set[str] = set()

        outputs: list[Any] = []
        response: dict[str, Any] = {}
        turns: list[dict[str, Any]] = []  # every model response, for per-turn token data
        steps = 0
        truncated = False
        started = time.monotonic()
        opts = self.options
        episode.max_tool_calls = opts.max_tool_calls  # a fresh episode per rollout (or turn)
        while steps < opts.max_steps:
            steps += 1
            response = await ctx.respond({**params, "input": items + outputs})
            outputs.extend(response["output"])
            turns.append(response)
            calls = function_calls(response)
            if not calls:
                break
            # Taken from the rollout's budget up front, the calls refused here included: each
            # is a call the model made, answered in the episode's place.
            run = episode.take_calls(min(len(calls), opts.max_tool_calls_per_message))
            undeclared.update(
                n for c in calls[:run] if is_tool_name(n := c.get("name")) and n not in declared
            )
            limit = opts.max_tool_argument_bytes
            outputs.extend(
                await asyncio.gather(
                    *(_call_tool(episode, c, declared, limit) for c in calls[:run])
                )
            )
            # Every call gets its output (a model is owed an answer to each), the rest unsent.
            spent = episode.tool_calls >= episode.max_tool_calls
            why = SPENT.format(opts.max_tool_calls) if spent else _PAST.format(run)
            outputs.extend(
                function_call_output(c.get("call_id", ""), tool_error(why)) for c in calls[run:]
            )
            if spent and len(calls) > run:
                truncated = True  # out of tool calls while the model wanted more: as max_steps
                break
        else:
            # Out of steps while the model still wanted its tools: the rollout is verified as
            # it stands (a truncated episode is still data), and marked so trainers can tell.
            truncated = True
        return Turn(
            response=final_response(response, outputs, turns),
            turns=turns,
            steps=steps,
            truncated=truncated,
            seconds=round(time.monotonic() - started, 4),
            undeclared=frozenset(undeclared),
        )


@dataclass(frozen=True)
class Turn:
    """What one run of the loop gave: the whole turn as one response, every model response
    in it, the model calls made, whether it ran out of steps, and its seconds."""

    response: dict[str, Any]
    turns: list[dict[str, Any]]
    steps: int
    truncated: bool
    seconds: float
    undeclared: frozenset[str] = frozenset()
    """Tool names the model called that the task does not declare (the calls were refused)."""


_PAST = NOT_RUN + "a message may make at most {} tool calls (max_tool_calls_per_message)"


def unsent_calls(response: dict[str, Any]) -> set[int]:
    """The positions, among the ``function_call`` items of a rollout's ``response``
    (``function_calls``), of the calls answered as past a cap, without being sent.

    By position, not ``call_id``: a model may give two calls one id, one sent and one not. An
    output answers the earliest call before it with its id that has no answer yet, as the agent
    answers a message's calls in order."""
    unsent: set[int] = set()
    waiting: dict[str, list[int]] = {}  # call_id -> positions of its calls not yet answered
    position = 0
    for item in response.get("output") or []:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "function_call":
            waiting.setdefault(str(item.get("call_id", "")), []).append(position)
            position += 1
        elif kind == "function_call_output":
            calls = waiting.get(str(item.get("call_id", "")))
            if calls and _not_run(item.get("output")):
                unsent.add(calls.pop(0))
            elif calls:
                calls.pop(0)
    return unsent


def _not_run(output: Any) -> bool:
    """Whether a call's output is the agent's answer to a call it did not send."""
    if not (isinstance(output, str) and NOT_RUN in output):  # cheap before a decode
        return False
    try:
        decoded = orjson.loads(output)
    except orjson.JSONDecodeError:
        return False  # a tool's own output
    error = decoded.get("error") if isinstance(decoded, dict) else None
    return isinstance(error, str) and error.startswith(NOT_RUN)


async def _call_tool(
    episode: Episode, call: dict[str, Any], declared: set[str], limit: int
) -> dict[str, Any]:
    name, call_id = call.get("name"), call.get("call_id", "")
    if not isinstance(name, str) or name not in declared:
        # Only the task's declared tools are callable (the episode also refuses endpoints).
        return function_call_output(call_id, tool_error(f"unknown tool {name!r}"))
    args = tool_arguments(call.get("arguments"), limit)
    if isinstance(args, ToolCallError):
        return function_call_output(call_id, tool_error(args.message))
    return function_call_output(call_id, await episode.send_tool(name, args))  # taken in loop


class ToolCallError:
    """Why a tool call's arguments are not passed on: the model is told, the rollout goes on."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def tool_arguments(raw: Any, limit: int) -> bytes | ToolCallError:
    """A function call's ``arguments`` as the JSON object to send to the tool (encoded once,
    here), or what is wrong with them. Model output is hostile input: orjson reads 1,024
    levels of nesting but writes only 255, so a call that parses can still fail to be sent."""
    if raw is None or raw == "":
        raw = "{}"
    if isinstance(raw, str):
        if len(raw) > limit:
            return ToolCallError(f"arguments of {len(raw)} characters exceed the {limit} allowed")
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return ToolCallError(f"arguments are not valid JSON: {exc}")
    if not isinstance(raw, dict):
        return ToolCallError(f"arguments must be a JSON object, not {type(raw).__name__}")
    try:
        encoded = orjson.dumps(raw)
    except TypeError as exc:  # orjson.JSONEncodeError: nested past 255 levels, a bad key
        return ToolCallError(f"arguments cannot be passed on as JSON: {exc}")
    if len(encoded) > limit:
        return ToolCallError(f"arguments of {len(encoded)} bytes exceed the {limit} allowed")
    return encoded


def drift_fields(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """``drifted_turns`` (and which) when the model server put token data on its calls: the
    calls whose prompt ids do not begin with the previous call's prompt + generation ids.

    Every call of this agent extends one conversation, so any mismatch is re-tokenisation
    drift: training on those ids would teach a sequence the model never saw.
    """
    calls = [CallTokens.of_item(t["output"][-1]) if t.get("output") else None for t in turns]
    if not any(calls):
        return {}
    drift = drifted_turns(calls)
    return {
        DRIFTED_TURNS: len(drift.turns),
        DRIFT_FIELD: {"checked": drift.checked, "turns": list(drift.turns)},
    }


def _tool_names(tools: Any) -> set[str]:
    names = (
        t.get("name") or (t.get("function") or {}).get("name")
        for t in tools or []
        if isinstance(t, dict)
    )
    return {n for n in names if isinstance(n, str) and n}
