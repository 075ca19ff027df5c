"""A recorded rollout as turns: what the model said in each turn, and what the environment
answered before the next one.

A rollout's ``response.output`` holds the whole episode in order: each model call's items (a
message, its ``function_call``s, reasoning) and the environment's items between calls (the
``function_call_output`` of each tool call, a Gymnasium observation as a user message). A turn is
one run of model items and the environment items that follow it. The items the environment adds
carry fresh ids in every run, so they are compared by what they say (``env_value``), never by id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One model call's output items, and the environment's items that answered it."""

    model: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)


def is_env_item(item: Any) -> bool:
    """Whether an output item is the environment's (a tool's output, a user or system
    message) rather than the model's."""
    if not isinstance(item, dict):
        return True  # nothing a model call answers: never served as the model's
    kind = item.get("type", "message")
    if isinstance(kind, str) and kind.endswith("_output"):
        return True
    return kind == "message" and item.get("role") not in (None, "assistant")


def split_turns(output: Any) -> tuple[list[dict[str, Any]], list[Turn]]:
    """``output`` (a rollout's ``response.output``) as the environment items before the first
    model item (none in rollgym's agents) and the turns."""
    prefix: list[dict[str, Any]] = []
    turns: list[Turn] = []
    for item in output if isinstance(output, list) else []:
        if is_env_item(item):
            (turns[-1].env if turns else prefix).append(item)
        elif turns and not turns[-1].env:
            turns[-1].model.append(item)
        else:
            turns.append(Turn(model=[item]))
    return prefix, turns


def model_turns(items: Any) -> int:
    """How many runs of model items ``items`` (a request's ``input``) holds: its model turns."""
    count, in_turn = 0, False
    for item in items if isinstance(items, list) else []:
        mine = not is_env_item(item)
        if mine and not in_turn:
            count += 1
        in_turn = mine
    return count


def env_value(item: Any) -> Any:
    """What an environment item says, without the ids a run draws afresh: a tool output's
    ``output`` (with its ``call_id``, the model's), a message's role and content."""
    if not isinstance(item, dict):
        return item
    if item.get("type", "message") == "message":
        return {"role": item.get("role"), "content": item.get("content")}
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def model_value(item: Any) -> Any:
    """A model item as served: compared whole (the replay serves the recorded item itself)."""
    return item
