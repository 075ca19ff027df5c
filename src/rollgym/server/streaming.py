"""Streamed answers, built from a complete one: what a model server sends for ``"stream": true``.

Both model servers know the whole answer before they send a byte (the scripted model makes it
up; the proxy reads its upstream's answer to the end first, so that retries stay possible), so
a stream here is the complete answer cut into the events the ``openai`` SDK parses:

- Responses API: ``response.created``, ``response.in_progress``, per output item its
  ``output_item.added`` / deltas / ``output_item.done``, then ``response.completed`` (or
  ``.incomplete`` / ``.failed``), each with its ``sequence_number``;
- chat completions: ``chat.completion.chunk`` objects (role, content, tool calls, the finish
  chunk, a usage chunk if ``stream_options.include_usage``), then ``data: [DONE]``.

The ``openai`` package's ``ResponseStreamEvent`` and ``ChatCompletionChunk`` are the reference
for every shape (tests parse these streams with the SDK's own streaming helpers).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from starlette.responses import Response

from rollgym.http.sse import encode_events, encode_typed_events

Event = dict[str, Any]

_FINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}


class EventStreamResponse(Response):
    """A whole server-sent-events body, sent at once."""

    media_type = "text/event-stream"

    def __init__(self, body: bytes) -> None:
        super().__init__(body, headers={"cache-control": "no-cache"})


def response_stream(response: dict[str, Any]) -> EventStreamResponse:
    """The Responses API's event stream for the complete ``response``."""
    return EventStreamResponse(encode_typed_events(response_events(response)))


def chat_stream(completion: dict[str, Any], params: dict[str, Any]) -> EventStreamResponse:
    """The chat completions stream for the complete ``completion`` asked for by ``params``."""
    return EventStreamResponse(encode_events(chat_chunks(completion, include_usage(params))))


def include_usage(params: dict[str, Any]) -> bool:
    options = params.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


# -- Responses API ---------------------------------------------------------------------------


def response_events(response: dict[str, Any]) -> list[Event]:
    """The events that stream ``response`` (a complete Responses API response object)."""
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> Event:
        return {"type": kind, "sequence_number": next(numbers), **fields}

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events = [event("response.created", response=started)]
    events.append(event("response.in_progress", response=started))
    for index, item in enumerate(response.get("output") or []):
        events.extend(_item_events(event, index, item))
    final = _FINAL.get(str(response.get("status")), "response.failed")
    events.append(event(final, response=response))
    return events


def _item_events(event: Callable[..., Event], index: int, item: dict[str, Any]) -> Iterator[Event]:
    kind, item_id = item.get("type"), item.get("id")
    at = {"item_id": item_id, "output_index": index}
    if kind == "function_call":
        arguments = item.get("arguments", "")
        added = {**item, "arguments": "", "status": "in_progress"}
        yield event("response.output_item.added", output_index=index, item=added)
        yield event("response.function_call_arguments.delta", delta=arguments, **at)
        yield event("response.function_call_arguments.done", arguments=arguments, **at)
    elif kind in ("message", "reasoning"):
        added = {**item, "content": [], "status": "in_progress"}
        yield event("response.output_item.added", output_index=index, item=added)
        for part_index, part in enumerate(item.get("content") or []):
            yield from _part_events(event, {**at, "content_index": part_index}, part)
    else:
        yield event("response.output_item.added", output_index=index, item=item)
    yield event("response.output_item.done", output_index=index, item=item)


def _part_events(event: Callable[..., Event], at: dict[str, Any], part: Any) -> Iterator[Event]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "output_text":
        text = part.get("text", "")
        yield event("response.content_part.added", part={**part, "text": ""}, **at)
        yield event("response.output_text.delta", delta=text, logprobs=[], **at)
        yield event("response.output_text.done", text=text, logprobs=[], **at)
    elif kind == "refusal":
        refusal = part.get("refusal", "")
        yield event("response.content_part.added", part={**part, "refusal": ""}, **at)
        yield event("response.refusal.delta", delta=refusal, **at)
        yield event("response.refusal.done", refusal=refusal, **at)
    elif kind == "reasoning_text":
        text = part.get("text", "")
        yield event("response.content_part.added", part={**part, "text": ""}, **at)
        yield event("response.reasoning_text.delta", delta=text, **at)
        yield event("response.reasoning_text.done", text=text, **at)
    else:
        yield event("response.content_part.added", part=part, **at)
    yield event("response.content_part.done", part=part, **at)


# -- chat completions ------------------------------------------------------------------------

_CHUNK_KEYS = ("id", "created", "model", "system_fingerprint", "service_tier")
_DELTA_TEXT = ("content", "reasoning_content", "reasoning", "refusal")


def chat_chunks(completion: dict[str, Any], usage: bool) -> list[Event]:
    """The ``chat.completion.chunk`` objects that stream ``completion``; the last one carries
    ``usage`` (with no choices) if ``usage``. A choice's other fields (``logprobs``, vLLM's
    ``token_ids``, ...) ride on its finish chunk."""
    base = {k: completion[k] for k in _CHUNK_KEYS if k in completion}
    base["object"] = "chat.completion.chunk"
    chunks: list[Event] = []
    for choice in completion.get("choices") or []:
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        deltas: list[dict[str, Any]] = [{"role": message.get("role", "assistant"), "content": ""}]
        deltas += [{key: message[key]} for key in _DELTA_TEXT if message.get(key)]
        for n, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            opening = {"name": function.get("name"), "arguments": ""}
            head = {"index": n, "id": call.get("id"), "type": "function", "function": opening}
            deltas.append({"tool_calls": [head]})
            tail = {"index": n, "function": {"arguments": function.get("arguments", "")}}
            deltas.append({"tool_calls": [tail]})
        for delta in deltas:
            piece = {"index": index, "delta": delta, "finish_reason": None, "logprobs": None}
            chunks.append({**base, "choices": [piece]})
        rest = {k: v for k, v in choice.items() if k not in ("index", "message")}
        finish = {"index": index, "delta": {}, "finish_reason": None, **rest}
        chunks.append({**base, "choices": [finish]})
    if usage and completion.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks
