"""Hermes-style tool calls read from generated text: ``<tool_call>{"name", "arguments"}</tool_call>``.

The model's output is adversarial (a random model's most of all): anything that is not a
well-formed call (no closing tag, JSON that does not parse, no string ``name``, arguments that
are not an object, text after the last call) leaves the whole output as text, as vLLM's
``hermes`` parser does, never an error. A call's ``arguments`` are kept as the exact JSON text
the model wrote when it can be found, so the chat template re-renders the model's own bytes on
the next turn (no re-tokenization drift from re-serialised JSON).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from rollgym.models.tiny import TOOL_CALL_END, TOOL_CALL_START

_ARGS_KEY = re.compile(r'"arguments"\s*:\s*')


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # NaN / Infinity: no other parser would read them


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: Python reads inf, no JSON encoder writes it back
        raise ValueError(f"{text} is not a finite number")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments' JSON text (an object)."""

    def as_chat(self) -> dict[str, object]:
        return {
            "id": f"call_{os.urandom(12).hex()}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: tuple[ToolCall, ...]


def parse_tool_calls(text: str) -> Parsed:
    """``text`` split into its leading content and its tool calls; all text if malformed."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return Parsed(text, ())
    calls = []
    end = start
    for block_start, inner, block_end in _blocks(text, start):
        if text[end:block_start].strip():
            return Parsed(text, ())  # prose between calls: not a clean sequence of calls
        call = _call(text[inner : block_end - len(TOOL_CALL_END)])
        if call is None:
            return Parsed(text, ())
        calls.append(call)
        end = block_end
    if not calls or text[end:].strip():
        return Parsed(text, ())  # an unclosed call, or text after the last one
    content = text[:start]
    return Parsed(content or None, tuple(calls))


def _blocks(text: str, pos: int) -> Iterator[tuple[int, int, int]]:
    """(start, content start, end) of each ``<tool_call>...</tool_call>`` from ``pos``, the
    first closing after each opening, in one pass (a lazy regex rescanned the rest of the text
    from every unclosed opening: quadratic in them)."""
    while (start := text.find(TOOL_CALL_START, pos)) >= 0:
        inner = start + len(TOOL_CALL_START)
        close = text.find(TOOL_CALL_END, inner)
        if close < 0:
            return
        pos = close + len(TOOL_CALL_END)
        yield start, inner, pos


def _call(block: str) -> ToolCall | None:
    try:
        data = _DECODER.decode(block)
    except (ValueError, RecursionError):  # deep nesting: the model's output, not our bug
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", {})
    if not isinstance(args, dict):
        return None
    try:
        # A lone surrogate (\ud800) decodes, but no answer can carry it: such a call is text.
        orjson.dumps(data)
    except TypeError:
        return None
    return ToolCall(data["name"], _raw_arguments(block, args))


def _raw_arguments(block: str, args: dict[str, object]) -> str:
    """The arguments' text as written, if it can be found unambiguously; else re-serialised."""
    for key in _ARGS_KEY.finditer(block):
        try:
            value, end = _DECODER.raw_decode(block, key.end())
        except (ValueError, RecursionError):
            continue
        # Compared as JSON, not with ==, under which true == 1 == 1.0: a decoy "arguments"
        # deeper in the call must not pass for the call's own.
        if orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            args, option=orjson.OPT_SORT_KEYS
        ):
            return block[key.end() : end]
    return json.dumps(args, ensure_ascii=False)
