"""Task rows as trainers' datasets see them: the one reading of a row's prompt as chat
messages (role and text), shared by every trainer bridge. The agent sends the row itself; these
messages are what a trainer's dataset shows, logs and matches prompts by."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from rollgym.errors import InputError

__all__ = ["TASK_FIELD", "carried_task", "message_text", "task_messages"]

TASK_FIELD = "rollgym_task"
"""The dataset column (or prompt stamp) that carries a rollgym task row to the bridge."""


def task_messages(task: Mapping[str, Any], index: int) -> list[dict[str, str]]:
    """The chat messages of ``task``'s ``responses_create_params.input``: a string is one user
    message; a list gives its message items (``type`` "message" or none), role defaulting to
    ``user``, content reduced to its text. ``InputError`` names the task when there is no
    input or no message in it."""
    params = task.get("responses_create_params")
    if not isinstance(params, Mapping):
        raise InputError(f"task {index} has no responses_create_params")
    given = params.get("input")
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list):
        raise InputError(f"task {index}: responses_create_params.input is neither text nor a list")
    messages = [
        {"role": str(m.get("role", "user")), "content": message_text(m.get("content"))}
        for m in given
        if isinstance(m, Mapping) and m.get("type", "message") == "message"
    ]
    if not messages:
        raise InputError(f"task {index}: responses_create_params.input has no message")
    return messages


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the ``text`` of its parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        )
    return ""


def carried_task(raw: Any, *, where: str, missing: str) -> dict[str, Any]:
    """The task row a dataset column carries (``TASK_FIELD``: JSON text or a mapping).
    ``InputError`` starting with ``where`` when it is not JSON; ``missing`` (the whole message)
    when it is absent or no mapping."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise InputError(f"{where}{TASK_FIELD} is not JSON: {e}") from e
    if not isinstance(raw, Mapping):
        raise InputError(f"{missing}; got {type(raw).__name__}")
    return dict(raw)
