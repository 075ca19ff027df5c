"""A streamed chat completion put back together: chunks in, the ``chat.completion`` out.

The proxy streams from its upstream only when asked to (``upstream_stream: true``, see
``rollgym.models.proxy``); what it hands on is then the completion the chunks add up to, which
has the upstream's token ids but, for vLLM with a tool parser, not always the message it would
have answered whole. Text deltas are joined, tool calls merged by their ``index``, lists
(``logprobs.content``, vLLM's ``token_ids``) concatenated in order; any other field keeps its
last non-null value (``finish_reason``, ``usage``, vLLM's ``prompt_token_ids``).

A stream that does not add up to a finished completion is a ``ProtocolError`` naming the
upstream: a half answer must never pass for a whole one.
"""

from __future__ import annotations

from typing import Any

from rollgym.errors import ProtocolError
from rollgym.models.translate import CHAT_ENDPOINT

_ONCE = frozenset({"role", "type", "id", "name", "index"})
"""Delta fields that are sent whole (once, or repeated unchanged): never joined."""


def assemble_chat(chunks: list[Any], *, upstream: str) -> dict[str, Any]:
    """The chat completion that ``chunks`` stream."""
    completion: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices", []), list):
            raise _protocol(upstream, "a chunk that is not a chat.completion.chunk object")
        for key, value in chunk.items():
            if key != "choices" and value is not None:
                completion[key] = value
        for piece in chunk.get("choices") or []:
            if not isinstance(piece, dict) or not isinstance(piece.get("index", 0), int):
                raise _protocol(upstream, "a chunk choice that is not an object with an index")
            _add_piece(choices, piece, upstream)
    if not choices:
        raise _protocol(upstream, "a stream with no choices")
    unfinished = [i for i, c in choices.items() if c.get("finish_reason") is None]
    if unfinished:
        raise _protocol(upstream, f"a stream whose choice {unfinished[0]} never finished")
    completion["object"] = "chat.completion"
    completion["choices"] = [_finished(choices[i]) for i in sorted(choices)]
    return completion


def _add_piece(choices: dict[int, dict[str, Any]], piece: dict[str, Any], upstream: str) -> None:
    index = piece.get("index", 0)
    choice = choices.setdefault(index, {"index": index, "message": {}, "calls": {}})
    delta = piece.get("delta") or {}
    if not isinstance(delta, dict):
        raise _protocol(upstream, "a chunk whose delta is not an object")
    message = choice["message"]
    for key, value in delta.items():
        if key == "tool_calls":
            for call in value or []:
                if not isinstance(call, dict):
                    raise _protocol(upstream, "a tool call delta that is not an object")
                slot = choice["calls"].setdefault(call.get("index", 0), {})
                _merge_into(slot, call)
        else:
            message[key] = _merge_value(key, message.get(key), value)
    for key, value in piece.items():
        if key in ("index", "delta") or value is None:
            continue
        choice[key] = _merge_value(key, choice.get(key), value) if key != "finish_reason" else value


# Strings and lists being joined are kept as their pieces until the stream ends: joining on
# each chunk copies everything so far, quadratic in a long generation's chunks (32,000 chunks
# took 2 s of the proxy's CPU).
class _Text(list[str]):
    """The pieces of a string being joined."""


class _Items(list[Any]):
    """The items of a list being concatenated."""


def _merge_into(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    for key, value in new.items():
        old[key] = _merge_value(key, old.get(key), value)
    return old


def _merge_value(key: str, old: Any, new: Any) -> Any:
    if new is None:
        return old
    if old is None or key in _ONCE:
        return _started(key, new)
    if isinstance(old, _Text) and isinstance(new, str):
        old.append(new)
        return old
    if isinstance(old, _Items) and isinstance(new, list):
        old.extend(new)
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        return _merge_into(old, new)
    return _started(key, new)


def _started(key: str, value: Any) -> Any:
    """``value`` as the first piece of what later chunks add to (a chunk's own objects are
    never changed)."""
    if key in _ONCE:
        return value
    if isinstance(value, str):
        return _Text([value])
    if isinstance(value, list):
        return _Items(value)
    if isinstance(value, dict):
        return _merge_into({}, value)
    return value


def _joined(value: Any) -> Any:
    """``value`` with its pieces joined."""
    if isinstance(value, _Text):
        return "".join(value)
    if isinstance(value, _Items):
        return list(value)
    if isinstance(value, dict):
        return {k: _joined(v) for k, v in value.items()}
    return value


def _finished(choice: dict[str, Any]) -> dict[str, Any]:
    calls = {i: _joined(call) for i, call in choice.pop("calls").items()}
    choice = _joined(choice)
    message = choice["message"]
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    if calls:
        message["tool_calls"] = [
            {k: v for k, v in calls[i].items() if k != "index"} for i in sorted(calls)
        ]
        if message["content"] == "":
            message["content"] = None  # as unstreamed: a turn of tool calls has no text
    choice.setdefault("logprobs", None)
    return choice


def _protocol(upstream: str, what: str) -> ProtocolError:
    return ProtocolError(
        f"{upstream} answered {CHAT_ENDPOINT} with {what}",
        server=upstream, endpoint=CHAT_ENDPOINT, method="POST",
    )  # fmt: skip
