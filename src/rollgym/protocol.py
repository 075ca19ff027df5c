"""The wire contracts of DESIGN.md as code: task rows, verify results, Gymnasium-style
``/reset`` and ``/step`` answers (the ledger's records are ``rollgym.collect.records``; the
names on the wire, headers and cookies, are ``rollgym.wire``'s).

Responses API objects themselves (requests, responses, items) are the ``openai`` package's
types; on the hot path they travel as plain dicts, and the tests check them against those types.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

import orjson
from pydantic import BaseModel, ConfigDict, Field

from rollgym.errors import InvalidRequest, ProtocolError
from rollgym.wire import MASK_SAMPLE, RESERVED_ENDPOINTS


class AgentRef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str


class ResponsesCreateParams(BaseModel):
    """The part of the Responses API create parameters that the collector checks up front."""

    model_config = ConfigDict(extra="allow")
    input: str | list[Any]


class FunctionTool(BaseModel):
    """A Responses API function tool, as ``GET /tools`` lists them: the fields of the ``openai``
    package's ``FunctionTool`` that rollgym reads (the tests hold the two to the same verdicts).
    Defined here so that nothing outside the ``dev`` extra needs ``openai``."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TaskRow(BaseModel):
    """One line of a task file: create params plus environment data."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: ResponsesCreateParams
    agent_ref: AgentRef | None = None
    task_index: int | None = Field(default=None, ge=0)
    rollout_index: int | None = Field(default=None, ge=0)


@dataclass(frozen=True)
class ToolOutput:
    """A tool's output that a Gymnasium-style step hands back to the model."""

    call_id: str
    output: str


@dataclass(frozen=True)
class Reset:
    """A Gymnasium-style ``/reset`` answer (``rollgym.server.gymnasium``)."""

    observation: str | None
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"observation": self.observation, "info": dict(self.info)}


@dataclass(frozen=True)
class Step:
    """A Gymnasium-style ``/step`` answer. ``tool_outputs`` travel as ``info.tool_outputs``."""

    observation: str | None
    reward: float
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    tool_outputs: tuple[ToolOutput, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        info = dict(self.info)
        if self.tool_outputs:
            info["tool_outputs"] = [
                {"call_id": t.call_id, "output": t.output} for t in self.tool_outputs
            ]
        return {
            "observation": self.observation,
            "reward": float(self.reward),
            "terminated": self.terminated,
            "truncated": self.truncated,
            "info": info,
        }


RESET_KEYS = frozenset({"observation", "info"})
STEP_KEYS = frozenset({"observation", "reward", "terminated", "truncated", "info"})
"""The keys of the Gymnasium protocol's answers: any other is none of the protocol's."""


def check_verified(verified: Any, agent: str, *, what: str = "agent answered") -> dict[str, Any]:
    """An agent's ``/run`` answer (or what ``what`` names: an episode's result), which must
    carry a finite numeric ``reward``."""
    reward = verified.get("reward") if isinstance(verified, dict) else None
    # A JSON ``true`` is an int to Python, but no reward.
    if not (
        isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)
    ):
        raise ProtocolError(
            f"{what} without a numeric 'reward'", server=agent, endpoint="/run",
            body=orjson.dumps(verified)[:2000],
        )  # fmt: skip
    # A mask_sample that is no boolean is no answer either: refused here, it is the agent's,
    # as a reward that is no number is.
    mask_sample(verified, server=agent)
    return verified  # type: ignore[no-any-return]


def mask_sample(verified: dict[str, Any], *, server: str | None = None) -> bool | None:
    """What a verify response says of ``mask_sample`` (true: its reward is no measurement; the
    environment's own infrastructure failed): True or False, None when it says nothing.

    ``ProtocolError`` (blaming ``server``) for a value that is no boolean (read as masked it
    would drop a real measurement, read as not masked it would train on a reward the
    environment said is none), and for one of its objects holding a ``mask_sample`` that the
    top-level one does not say (NeMo RL's ``instance_config``): rollgym reads the flag at the
    top only, and one it does not read is never dropped in silence. A dialect that reads it
    elsewhere lifts it to the top first (its row dialect)."""
    said = verified.get(MASK_SAMPLE)
    if said is not None and not isinstance(said, bool):
        raise _mask_error(verified, server, f"{MASK_SAMPLE} {_shown(said)}, which is no boolean")
    for key, value in verified.items():
        nested = value.get(MASK_SAMPLE) if isinstance(value, dict) else None
        if nested is not None and nested is not (said is True):
            raise _mask_error(
                verified, server, f"{key}.{MASK_SAMPLE} {_shown(nested)} but "
                f"{MASK_SAMPLE} {_shown(said)} at the top, where it is read",
            )  # fmt: skip
    return said


def is_masked(record: dict[str, Any]) -> bool:
    """Whether a verify response (or its line in ``rollouts.jsonl``) asks to be masked."""
    return record.get(MASK_SAMPLE) is True


def _mask_error(verified: dict[str, Any], server: str | None, what: str) -> ProtocolError:
    return ProtocolError(
        f"verify response has {what} (true: the reward is no measurement; false or absent: it "
        "is one)", server=server, body=orjson.dumps(verified)[:2000],
    )  # fmt: skip


def _shown(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()[:100]
    except TypeError:
        return type(value).__name__


def rollout_key(row: dict[str, Any]) -> str:
    return f"{row.get('task_index')}:{row.get('rollout_index')}"


def output_text(response: dict[str, Any]) -> str:
    """All the assistant's output text in a Responses API response: the ``output_text`` parts of
    every assistant ``message`` item, in order, joined with nothing between them (``""`` if none).

    This is what the ``openai`` package's ``Response.output_text`` and NeMo Gym's verifiers read,
    so a reward does not change with the side that computes it: reasoning items, tool calls and
    their outputs, refusals and other roles' messages are not part of it. Joining without a
    separator is theirs too: ``"Answer: B"`` then ``"Thanks"`` reads ``"Answer: BThanks"``. An
    assistant message whose content is not a list of parts is no Responses API output (their
    verifiers fail on it too): it is refused (422) rather than read one way or another.
    """
    texts: list[str] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        if item.get("role", "assistant") != "assistant":
            continue  # e.g. an environment's observation that an agent put in the output
        parts = item.get("content")
        if not isinstance(parts, list):
            raise InvalidRequest(
                "an assistant message in a response's output must have a list of content "
                f"parts, not {type(parts).__name__}",
                status=422,
            )
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
    return "".join(texts)


def function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``function_call`` items of a Responses API response, in order."""
    return [
        item
        for item in response.get("output") or []
        if isinstance(item, dict) and item.get("type") == "function_call"
    ]


def tool_error(message: str) -> str:
    """A tool call's output that says why it gave no result, ``{"error": message}``: how a
    resources server's own refusal reads, so the model sees one shape whoever refused."""
    return orjson.dumps({"error": message}).decode()


TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
"""The names a function call may send to a resources server as ``POST /<name>``: ASCII
letters, digits and ``_``, a letter first, at most 64 characters (OpenAI's bound)."""


def is_tool_name(name: object) -> TypeGuard[str]:
    """Whether a function call naming ``name`` may reach a resources server as a tool.

    Model output is hostile input: only a plain ASCII name (``TOOL_NAME``) passes, so neither a
    leading ``_`` (``__init__``, ``_session``) nor a lookalike (a fullwidth letter, a zero-width
    space) does; a reserved endpoint is refused in any spelling, compared after NFKC and
    casefold (``VERIFY``): a server that folds case or normalizes its paths is not reached."""
    if not isinstance(name, str) or len(name) > 64:
        return False
    # Folded first, so the rule stays whole if the pattern ever admits more than ASCII.
    if is_reserved_name(name):
        return False
    return TOOL_NAME.fullmatch(name) is not None


def is_reserved_name(name: str) -> bool:
    """Whether ``name`` is, in some spelling (NFKC, casefold), one a resources server keeps for
    itself (``rollgym.wire.RESERVED_ENDPOINTS``: its endpoints and its hooks)."""
    return unicodedata.normalize("NFKC", name).casefold() in RESERVED_ENDPOINTS
