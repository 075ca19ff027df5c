"""A chat completions request to the CPU backend, checked into typed records before any work.

Everything a caller can get wrong is refused here with a 4xx that says what to change: a
malformed message, a sampling parameter out of range, ``max_tokens`` past the server's cap, and
any field this backend does not implement that would change what is generated (``n`` > 1,
``logit_bias``, ``response_format``, penalties, ...): answering as if it were absent would hand
back a sample from another distribution than the one asked for. Fields that change nothing
here (``user``, ``metadata``, ``store``, ...) are accepted and ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rollgym.errors import InvalidRequest

MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool"}  # fmt: skip
_IGNORED = frozenset(
    {
        "model",  # one model is served, whatever its name in the request
        "user",
        "metadata",
        "store",
        "service_tier",
        "stream_options",
        "parallel_tool_calls",  # every call the model writes is parsed, one or several
        "reasoning_effort",  # the model has no reasoning mode
        "skip_special_tokens",  # decoding keeps none of the chat template's specials anyway
        "add_generation_prompt",
        "include_stop_str_in_output",
        "continue_final_message",
        "spaces_between_special_tokens",
    }
)
_HANDLED = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "n",
        "stop",
        "stream",
        "logprobs",
        "top_logprobs",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "chat_template_kwargs",
        # Refused unless neutral (checked below); listed so they get that message.
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
        "min_tokens",
    }
)
_NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0,
            "min_tokens": 0}  # fmt: skip


@dataclass(frozen=True)
class Sampling:
    """How to pick each token. ``temperature`` 0 is greedy (its logprobs are of the unscaled
    distribution, as vLLM's are)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: off."""
    max_tokens: int = 16
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat completions request: what to render and how to sample."""

    messages: list[dict[str, Any]]
    """The messages as the chat template takes them: roles mapped, content as a string."""
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    """Whether to read tool calls from the output (tools given and ``tool_choice`` not none)."""
    sampling: Sampling
    max_tokens_given: bool
    """Whether the caller set ``max_tokens`` (else it is what the context has room for)."""
    logprobs: bool
    top_logprobs: int
    token_id_strings: bool
    """``return_tokens_as_token_ids``: logprob entries name tokens as ``token_id:N``."""
    return_token_ids: bool
    stream: bool
    template_kwargs: dict[str, Any]


def parse_chat(body: dict[str, Any], *, max_tokens_cap: int) -> ChatRequest:
    """``body`` checked; ``InvalidRequest`` (400/422) naming the field otherwise."""
    for key in body:
        if key not in _HANDLED and key not in _IGNORED:
            raise _bad(
                f"{key!r} is not implemented by this CPU backend, and ignoring it would change "
                "what is generated: leave it out"
            )
    for key, neutral in _NEUTRAL.items():
        value = body.get(key)
        if value is not None and value != neutral:
            raise _bad(f"{key} {value!r} is not implemented by this CPU backend (only {neutral})")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad(f"n must be 1 (one generation per request), not {n!r}")
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise _bad(
            f"tool_choice {choice!r}: only 'auto' and 'none' (this backend cannot force a call)"
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    given = max_tokens is not None
    if max_tokens is not None:
        _int_at_least("max_tokens", max_tokens, 1)
        if max_tokens > max_tokens_cap:
            raise _bad(
                f"max_tokens {max_tokens} is past this server's cap of {max_tokens_cap} "
                "(--max-tokens-cap)"
            )
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None:
        _int_at_least("top_logprobs", top_logprobs, 0)
        if top_logprobs > MAX_TOP_LOGPROBS:
            raise _bad(f"top_logprobs must be at most {MAX_TOP_LOGPROBS}")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _bad("chat_template_kwargs must be an object")
    sampling = Sampling(
        temperature=_number("temperature", body.get("temperature"), 1.0, 0.0, 100.0),
        top_p=_number("top_p", body.get("top_p"), 1.0, 0.0, 1.0, low_open=True),
        top_k=_top_k(body.get("top_k")),
        max_tokens=int(max_tokens) if max_tokens is not None else max_tokens_cap,
        seed=_seed(body.get("seed")),
        stop=_stop(body.get("stop")),
    )
    return ChatRequest(
        messages=messages(body.get("messages")),
        tools=tools,
        parse_tools=bool(tools) and choice != "none",
        sampling=sampling,
        max_tokens_given=given,
        logprobs=_flag(body, "logprobs"),
        top_logprobs=top_logprobs or 0,
        token_id_strings=_flag(body, "return_tokens_as_token_ids"),
        return_token_ids=_flag(body, "return_token_ids"),
        stream=_flag(body, "stream"),
        template_kwargs=dict(kwargs or {}),
    )


def messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI chat ``messages`` as the chat template takes them; 400 naming the bad one."""
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list")
    out = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}] must be an object")
        role = _ROLES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise _bad(
                f"messages[{i}].role {message.get('role')!r} is not one of {', '.join(_ROLES)}"
            )
        entry: dict[str, Any] = {"role": role, "content": _text(message.get("content"), i)}
        calls = message.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise _bad(f"messages[{i}].tool_calls must be a list on an assistant message")
            entry["tool_calls"] = [_tool_call(c, i, j) for j, c in enumerate(calls)]
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            entry["tool_call_id"] = message["tool_call_id"]
        out.append(entry)
    return out


def _text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{i}].content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts")


def _tool_call(call: Any, i: int, j: int) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
        raise _bad(f"messages[{i}].tool_calls[{j}] needs function.name")
    args = fn.get("arguments", "{}")
    if not isinstance(args, (str, dict)):
        raise _bad(f"messages[{i}].tool_calls[{j}].function.arguments must be a string")
    # Kept as the caller's text: the template renders it verbatim (no re-serialised JSON).
    return {"id": call.get("id"), "type": "function",
            "function": {"name": fn["name"], "arguments": args}}  # fmt: skip


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise _bad("'tools' must be a list")
    for i, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
    return list(raw)


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise _bad(f"{key} must be true or false")
    return bool(value)


def _number(
    key: str, value: Any, default: float, low: float, high: float, *, low_open: bool = False
) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{key} must be a number")
    if value < low or value > high or (low_open and value == low):
        side = "(" if low_open else "["
        raise _bad(f"{key} {value!r} is outside {side}{low:g}, {high:g}]")
    return float(value)


def _int_at_least(key: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(f"{key} must be an integer of at least {low}, not {value!r}")


def _top_k(value: Any) -> int:
    if value is None or value == -1:  # vLLM's "off"
        return 0
    _int_at_least("top_k", value, 0)
    return int(value)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise _bad(f"seed must be an integer in [0, 2**63), not {value!r}")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not (
        isinstance(stops, list)
        and len(stops) <= MAX_STOP_STRINGS
        and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
    ):
        raise _bad(
            f"stop must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings "
            f"of at most {MAX_STOP_CHARS} characters"
        )
    return tuple(stops)


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(message, status=400)
