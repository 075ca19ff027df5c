"""Server-sent events as OpenAI-compatible servers stream them: ``data: {json}`` events, then
``data: [DONE]``.

Parsing is pure (bytes in, JSON values out) so that a streamed answer read whole by the
transport is decoded like any other body, inside the attempt: a garbled or cut stream is a
failed attempt, retried like a garbled JSON answer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

DONE = b"[DONE]"


class Events(NamedTuple):
    """The ``data`` of each event of a stream, decoded, and whether ``[DONE]`` ended it."""

    data: list[Any]
    done: bool


def parse_events(raw: bytes) -> Events:
    """The events of an SSE body. Lines other than ``data:`` (comments, ``event:``, ``id:``,
    keep-alives) are skipped; the ``data:`` lines of one event are joined by newlines, as the
    SSE standard says. Raises ``orjson.JSONDecodeError`` (a ``ValueError``) for bad JSON."""
    out: list[Any] = []
    lines: list[bytes] = []
    for line in raw.replace(b"\r\n", b"\n").split(b"\n"):
        if line.startswith(b"data:"):
            lines.append(line[6:] if line.startswith(b"data: ") else line[5:])
            continue
        if line.strip() or not lines:
            continue  # a field we do not use, or blank lines between events
        data = b"\n".join(lines)
        lines = []
        if data.strip() == DONE:
            return Events(out, True)
        out.append(orjson.loads(data))
    if lines:  # the last event, not followed by a blank line
        data = b"\n".join(lines)
        if data.strip() == DONE:
            return Events(out, True)
        out.append(orjson.loads(data))
    return Events(out, False)


def encode_events(events: list[Any], *, done: bool = True) -> bytes:
    """An SSE body of ``events`` (each a JSON value, as ``data:``), ending in ``data: [DONE]``
    if ``done`` (chat completions end so; the Responses API ends with its last event)."""
    parts = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]
    if done:
        parts.append(b"data: " + DONE + b"\n\n")
    return b"".join(parts)


def encode_typed_events(events: list[dict[str, Any]]) -> bytes:
    """An SSE body of Responses API events, each with its ``event:`` line (its ``type``), as
    OpenAI sends them."""
    return b"".join(
        b"event: "
        + str(e.get("type", "message")).encode()
        + b"\ndata: "
        + orjson.dumps(e)
        + b"\n\n"
        for e in events
    )
