"""The scripted model: a deterministic stand-in for an LLM, for demos, tests and benchmarks.

It is NOT a language model. It answers OpenAI-compatible ``/v1/responses`` and
``/v1/chat/completions`` requests by following a script carried in the request's
``metadata.rollgym_script`` (a JSON list of turns; turn i answers the model's i-th turn):

- ``{"call": "tool", "arguments": {...}}`` or ``{"calls": [{"name", "arguments"}, ...]}``
- ``{"say": "text"}`` or ``{"say": ["alt 1", "alt 2"]}``: one alternative per rollout, chosen by
  a hash of the rollout id (the ``x-rollgym-rollout`` header, else the ``<id>`` of the
  ``/ng-rollout/<id>/`` path), so repeats can differ but a rerun gives the same answers.
  ``{tool_output}`` in the text is replaced by the last tool output.

Without a script it calls the first declared tool once (string arguments filled from the last
user message) and then says the tool's output; with no tools it says a fixed sentence.
Option ``latency`` (seconds) delays every answer, to stand in for model time in benchmarks;
``latency_dist: {lognormal: {median_s: 0.05, p99_over_median: 30}, seed: 0}`` adds a
long-tailed delay drawn per call, the same for the same rollout and turn in every run
(``rollgym.models.latency``).
With ``"stream": true`` (either endpoint) the answer comes as server-sent events, as the
``openai`` SDK's streaming calls expect (``rollgym.server.streaming``).

``GET /v1/models`` lists ``rollgym-scripted``. ``POST /tokenize`` answers like vLLM's
(``{"count", "max_model_len", "tokens", "token_strs"}`` for a ``prompt`` or chat ``messages``)
with a made-up deterministic tokenizer: the same text always gives the same ids, and that is
all it promises. ``/ng-rollout/<id>/training-token-capture/...`` is served as the plain call: a
stand-in has no training token ids to give.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
from collections.abc import Iterable
from typing import Any

import orjson
from pydantic import Field
from starlette.responses import Response
from starlette.routing import BaseRoute

from rollgym.errors import InvalidRequest
from rollgym.models.latency import LatencyDist
from rollgym.server.endpoint import Call
from rollgym.server.model import (
    ModelServer,
    json_object,
    model_list,
    openai_routes,
)
from rollgym.server.streaming import chat_stream

NO_SCRIPT_ANSWER = "I have no script for this task."
MODEL_ID = "rollgym-scripted"
MAX_MODEL_LEN = 32768
VOCAB_SIZE = 131072
BOS_ID = 1


class ScriptedModel(ModelServer):
    own_upstream = True

    class Options(ModelServer.Options):
        latency: float = Field(default=0.0, ge=0, description="seconds added to every answer")
        latency_dist: LatencyDist | None = Field(
            default=None, description="seconds added to every answer, drawn per call (seeded)"
        )

    options: Options

    def routes(self) -> list[BaseRoute]:
        return [
            *super().routes(),
            *openai_routes(self.policy, self._chat, self._models, self._tokenize),
        ]

    async def _models(self, body: Any, call: Call) -> Any:
        return model_list(MODEL_ID)

    async def _tokenize(self, body: Any, call: Call) -> Any:
        return tokenize(json_object(body))

    async def _delay(self, rollout: str | None, turn: int) -> None:
        # Inside the model call's policy gate: a pause's abort cancels the sleep.
        dist = self.options.latency_dist
        seconds = self.options.latency + (dist.draw(rollout, turn) if dist is not None else 0.0)
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        if "input" not in params:
            raise InvalidRequest("a Responses API request needs 'input'", status=400)
        items = _input_items(params["input"])
        turn, tool_output, user_text = _history(items)
        action = decide(params, turn, tool_output, user_text, call.rollout)
        await self._delay(call.rollout, turn)
        return build_response(params, action)  # streamed, if asked, by the base

    async def _chat(self, body: Any, call: Call) -> Any:
        params = json_object(body)
        if not isinstance(params.get("messages"), list):
            raise InvalidRequest("a chat completions request needs 'messages'", status=400)
        turn, tool_output, user_text = _chat_history(params["messages"])
        tools = [
            {
                "name": t.get("function", {}).get("name"),
                "parameters": t.get("function", {}).get("parameters"),
            }
            for t in params.get("tools") or []
            if isinstance(t, dict)
        ]
        action = decide(
            {"metadata": params.get("metadata"), "tools": tools},
            turn,
            tool_output,
            user_text,
            call.rollout,
        )
        await self._delay(call.rollout, turn)
        completion = build_chat_completion(params, action)
        return chat_stream(completion, params) if params.get("stream") else completion


# -- deciding what to say -------------------------------------------------------------------


def _input_items(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise InvalidRequest("'input' must be a string or a list of items", status=400)
    return [i for i in raw if isinstance(i, dict)]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _history(items: list[dict[str, Any]]) -> tuple[int, str | None, str]:
    """(model turns so far, last tool output, last user text) of a Responses API input."""
    return _fold(_item_event(item) for item in items)


def _chat_history(messages: list[Any]) -> tuple[int, str | None, str]:
    """The same of chat completions ``messages``."""
    return _fold(_message_event(msg) for msg in messages if isinstance(msg, dict))


def _item_event(item: dict[str, Any]) -> tuple[str | None, str]:
    kind = item.get("type", "message")
    role = item.get("role") if kind == "message" else None
    if kind in ("function_call", "reasoning") or role == "assistant":
        return "model", ""
    if kind == "function_call_output":
        out = item.get("output")
        return "tool", out if isinstance(out, str) else orjson.dumps(out).decode()
    if role == "user":
        return "user", _text_of(item.get("content"))
    return None, ""


def _message_event(msg: dict[str, Any]) -> tuple[str | None, str]:
    role = msg.get("role")
    if role == "assistant":
        return "model", ""
    if role in ("tool", "user"):
        return role, _text_of(msg.get("content"))
    return None, ""


def _fold(events: Iterable[tuple[str | None, str]]) -> tuple[int, str | None, str]:
    """(model turns, last tool output, last user text) of a history's events, each ``(who,
    text)`` with ``who`` one of ``model``, ``tool``, ``user`` or None: a run of model events
    is one turn (a message and its tool calls)."""
    turns, in_turn = 0, False
    tool_output: str | None = None
    user_text = ""
    for who, text in events:
        if who == "model" and not in_turn:
            turns += 1
        in_turn = who == "model"
        if who == "tool":
            tool_output = text
        elif who == "user":
            user_text = text
    return turns, tool_output, user_text


def _pick(options: list[Any], rollout: str | None, turn: int) -> Any:
    digest = hashlib.blake2b(f"{rollout}|{turn}".encode(), digest_size=8).digest()
    return options[int.from_bytes(digest, "big") % len(options)]


def _script_calls(calls: Any, turn: int) -> list[dict[str, Any]]:
    # A malformed script is the caller's mistake (400), not a crash of the model server (500).
    if not isinstance(calls, list) or not calls:
        raise InvalidRequest(f"script turn {turn}: 'calls' must be a non-empty list", status=400)
    for call in calls:
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
            raise InvalidRequest(
                f"script turn {turn}: each of 'calls' needs a string 'name'", status=400
            )
    return [{"name": c["name"], "arguments": c.get("arguments", {})} for c in calls]


def decide(
    params: dict[str, Any], turn: int, tool_output: str | None, user_text: str, rollout: str | None
) -> dict[str, Any]:
    """The action for this turn: ``{"say": text}`` or ``{"calls": [{"name", "arguments"}]}``."""
    metadata = params.get("metadata") or {}
    script_raw = metadata.get("rollgym_script") if isinstance(metadata, dict) else None
    if script_raw is not None:
        try:
            script = orjson.loads(script_raw) if isinstance(script_raw, str) else script_raw
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(
                f"metadata.rollgym_script is not valid JSON: {exc}", status=400
            ) from None
        if not isinstance(script, list) or not script:
            raise InvalidRequest(
                "metadata.rollgym_script must be a non-empty list of turns", status=400
            )
        step = script[min(turn, len(script) - 1)]
        if not isinstance(step, dict):
            raise InvalidRequest(f"script turn {turn} must be an object", status=400)
        if "call" in step:
            call = {"name": step["call"], "arguments": step.get("arguments", {})}
            return {"calls": _script_calls([call], turn)}
        if "calls" in step:
            return {"calls": _script_calls(step["calls"], turn)}
        say = step.get("say", "")
        text = _pick(say, rollout, turn) if isinstance(say, list) and say else str(say)
        return {"say": str(text).replace("{tool_output}", tool_output or "")}
    tools = [t for t in params.get("tools") or [] if isinstance(t, dict) and t.get("name")]
    if tools and tool_output is None:
        first = tools[0]
        props = ((first.get("parameters") or {}).get("properties") or {}).items()
        args = {k: user_text for k, v in props if isinstance(v, dict) and v.get("type") == "string"}
        return {"calls": [{"name": first["name"], "arguments": args}]}
    if tool_output is not None:
        return {"say": tool_output}
    return {"say": NO_SCRIPT_ANSWER}


# -- building the answer --------------------------------------------------------------------


def _arguments(call: dict[str, Any]) -> str:
    """A call's arguments as the JSON text both APIs carry."""
    args = call.get("arguments", {})
    return args if isinstance(args, str) else orjson.dumps(args).decode()


def _usage(params: dict[str, Any], action: dict[str, Any]) -> tuple[int, int]:
    # Whitespace "tokens" of the prompt and of what is said (or of the calls' arguments): a
    # stand-in count so that usage fields are present and plausible.
    prompt = len(orjson.dumps(params.get("input", params.get("messages", "")))) // 4
    said = action["say"] if "say" in action else "".join(map(_arguments, action["calls"]))
    return prompt, max(1, len(said.split()))


def _string_metadata(metadata: Any) -> dict[str, str]:
    # The Responses API's metadata maps keys to strings; a script given as a JSON list (handy
    # in task files) is echoed back as its JSON text, so the response stays a valid Response.
    if not isinstance(metadata, dict):
        return {}
    return {
        str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in metadata.items()
    }


def build_response(params: dict[str, Any], action: dict[str, Any]) -> dict[str, Any]:
    """A complete Responses API response object for ``action``."""
    output: list[dict[str, Any]] = []
    if "say" in action:
        output.append(
            {
                "type": "message",
                "id": f"msg_{os.urandom(12).hex()}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": action["say"], "annotations": []}],
            }
        )
    else:
        for call in action["calls"]:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{os.urandom(12).hex()}",
                    "call_id": f"call_{os.urandom(12).hex()}",
                    "name": call["name"],
                    "arguments": _arguments(call),
                    "status": "completed",
                }
            )
    n_in, n_out = _usage(params, action)
    return {
        "id": f"resp_{os.urandom(16).hex()}",
        "object": "response",
        "created_at": int(time.time()),
        "model": params.get("model") or MODEL_ID,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)),
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools") or [],
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "max_output_tokens": params.get("max_output_tokens"),
        "metadata": _string_metadata(params.get("metadata")),
        "instructions": params.get("instructions"),
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": n_in,
            # Every field the ``openai`` types require, so the response parses as a Response.
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_in + n_out,
        },
    }


def build_chat_completion(params: dict[str, Any], action: dict[str, Any]) -> dict[str, Any]:
    """A complete chat completion object for ``action``."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if "say" in action:
        message["content"] = action["say"]
        finish = "stop"
    else:
        message["tool_calls"] = [
            {
                "id": f"call_{os.urandom(12).hex()}",
                "type": "function",
                "function": {"name": call["name"], "arguments": _arguments(call)},
            }
            for call in action["calls"]
        ]
        finish = "tool_calls"
    n_in, n_out = _usage(params, action)
    return {
        "id": f"chatcmpl-{os.urandom(16).hex()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": params.get("model") or MODEL_ID,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
    }


# -- tokenizing ------------------------------------------------------------------------------

_PIECES = re.compile(r"<\|[a-z_]+\|>|\w+|[^\w\s]")


def tokenize(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``/tokenize`` answer for ``body`` (a ``prompt``, or chat ``messages`` with optional
    ``tools``), from a made-up tokenizer: words, punctuation and role markers, each an id
    hashed from its text."""
    if isinstance(body.get("messages"), list):
        text = _chat_text(
            body["messages"], body.get("tools"), body.get("add_generation_prompt", True)
        )
        special = body.get("add_special_tokens", False)
    elif isinstance(body.get("prompt"), str):
        text, special = body["prompt"], body.get("add_special_tokens", True)
    else:
        raise InvalidRequest("/tokenize needs a 'prompt' string or a 'messages' list", status=400)
    pieces = _PIECES.findall(text)
    tokens = [_token_id(p) for p in pieces]
    if special:
        pieces, tokens = ["<s>", *pieces], [BOS_ID, *tokens]
    return {
        "count": len(tokens),
        "max_model_len": MAX_MODEL_LEN,
        "tokens": tokens,
        "token_strs": pieces if body.get("return_token_strs") else None,
    }


def _token_id(piece: str) -> int:
    digest = hashlib.blake2b(piece.encode(), digest_size=4).digest()
    return 2 + int.from_bytes(digest, "big") % (VOCAB_SIZE - 2)  # 0, 1: pad and BOS


def _chat_text(messages: list[Any], tools: Any, generation_prompt: Any) -> str:
    parts = []
    if tools:
        parts.append(f"<|tools|>{orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode()}\n")
    for msg in messages:
        if not isinstance(msg, dict):
            raise InvalidRequest("/tokenize: each of 'messages' must be an object", status=400)
        text = _text_of(msg.get("content"))
        if msg.get("tool_calls"):
            text += orjson.dumps(msg["tool_calls"], option=orjson.OPT_SORT_KEYS).decode()
        parts.append(f"<|{msg.get('role', 'user')}|>{text}\n")
    if generation_prompt:
        parts.append("<|assistant|>")
    return "".join(parts)
