"""Responses API <-> Chat Completions, as pure functions over plain dicts.

Upstreams such as vLLM and SGLang speak Chat Completions; agents and task files speak the
Responses API. ``responses_to_chat`` turns Responses create params into a chat request and
``chat_to_response`` turns the chat completion back into a Responses API response object. The
``openai`` package's types are the reference for every shape here (the tests validate against
them); on the hot path everything stays a dict.

A malformed request is an ``InvalidRequest`` (the caller's fault, answered 4xx); a malformed
upstream answer is a ``ProtocolError`` naming the upstream (answered 502).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from rollgym.errors import InvalidRequest, ProtocolError
from rollgym.wire import UPSTREAM_KEY

CHAT_ENDPOINT = "/chat/completions"

# Token-level fields a vLLM upstream may attach, kept for trainers under ``UPSTREAM_KEY``.
_COMPLETION_EXTRAS = ("prompt_token_ids", "prompt_logprobs")
_CHOICE_EXTRAS = ("token_ids", "logprobs", "stop_reason")

# Chat templates of open models know system/user/assistant/tool; not all know "developer".
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TOOL_CHOICE_MODES = ("none", "auto", "required")
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}

_SAME_NAME = ("temperature", "top_p", "seed", "stop", "frequency_penalty", "presence_penalty")
"""Sampling parameters spelt alike in both APIs (``seed`` and ``stop`` are chat-only in
OpenAI's types, but task rows and vLLM use them)."""

_REFUSED: dict[str, tuple[Any, ...]] = {
    # Responses-only options that would change the answer; their no-op values pass.
    "background": (False,),
    # "auto" only acts past the context window, where the upstream answers 400 instead: loud.
    "truncation": ("disabled", "auto"),
    "max_tool_calls": (),
    "conversation": (),
    "prompt": (),
}

_HANDLED = frozenset(
    {
        *_SAME_NAME,
        *_REFUSED,
        "input",
        "instructions",
        "model",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "top_logprobs",
        "reasoning",
        "text",
        "previous_response_id",
        # No effect on the tokens generated: bookkeeping of the Responses API, or handled by
        # the server (streaming to the client is the proxy's own business, not the upstream's).
        "stream",
        "stream_options",
        "metadata",
        "store",
        "user",
        "include",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
    }
)
"""Responses create params translated, refused or known to change nothing upstream; any other
key is passed through to the chat request unchanged."""


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- request: Responses create params -> chat completion request ------------------------------


def responses_to_chat(params: dict[str, Any], *, model: str | None = None) -> dict[str, Any]:
    """A chat completions request for Responses API create ``params``; ``model`` overrides."""
    if params.get("previous_response_id"):
        raise InvalidRequest(
            "the proxy keeps no conversation state: send the whole conversation as 'input' "
            "instead of 'previous_response_id'",
            status=400,
        )
    messages: list[dict[str, Any]] = []
    instructions = params.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("'instructions' must be a string", status=422)
        messages.append({"role": "system", "content": instructions})
    messages.extend(input_messages(params.get("input")))

    chat: dict[str, Any] = {"messages": messages}
    name = model or params.get("model")
    if name:
        chat["model"] = name
    tools = params.get("tools") or []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be a list", status=422)
    choice = params.get("tool_choice")
    if tools:
        chat["tools"] = [chat_tool(t, i) for i, t in enumerate(tools)]
        # Chat APIs refuse tool_choice / parallel_tool_calls without tools.
        if choice is not None:
            chat["tool_choice"] = chat_tool_choice(choice)
        if params.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = bool(params["parallel_tool_calls"])
    elif choice not in (None, "none", "auto"):
        # "auto"/"none" without tools change nothing; demanding a call of no tool does.
        raise InvalidRequest(f"tool_choice {choice!r} needs 'tools'", status=422)
    for key in _SAME_NAME:
        if params.get(key) is not None:
            chat[key] = params[key]
    if params.get("max_output_tokens") is not None:
        chat["max_tokens"] = params["max_output_tokens"]
    if params.get("top_logprobs") is not None:
        chat["logprobs"] = True
        chat["top_logprobs"] = params["top_logprobs"]
    effort = (params.get("reasoning") or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = effort
    response_format = _response_format(params.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    _refuse_untranslatable(params)
    for key, value in params.items():
        # An upstream's own sampling parameters (vLLM's top_k, min_p, repetition_penalty,
        # chat_template_kwargs, ...) go through as they are: dropping one would change the
        # sampling without a word.
        if key not in _HANDLED and value is not None:
            chat.setdefault(key, value)
    return chat


def _response_format(text: Any) -> dict[str, Any] | None:
    """Chat ``response_format`` for a Responses ``text`` option (``None``: plain text)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict):
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(
        f"text.format {fmt!r} is not supported by the proxy (text, json_object, json_schema)",
        status=422,
    )


def _refuse_untranslatable(params: dict[str, Any]) -> None:
    for key, harmless in _REFUSED.items():
        value = params.get(key)
        if value is not None and value not in harmless:
            raise InvalidRequest(
                f"{key!r} ({value!r}) has no chat completions counterpart and is not supported "
                "by the proxy",
                status=422,
            )


def input_messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages for a Responses ``input``: a string, or a list of input items."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest("'input' must be a string or a list of items", status=422)
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item rides on the next assistant message
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{index}] must be an object", status=422)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            message = _message(item, index)
            if message["role"] == "assistant" and reasoning is not None:
                _with_reasoning(message, reasoning)
                reasoning = None
            messages.append(message)
        elif kind == "function_call":
            call = _tool_call(item, index)
            last = messages[-1] if messages else None
            # Consecutive calls (and the assistant text just before them) are one assistant
            # turn, as the model produced it: rebuilding it the same way keeps the prompt the
            # chat template renders identical to the one the model saw.
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            if reasoning is not None:
                _with_reasoning(messages[-1], reasoning)
                reasoning = None
        elif kind == "function_call_output":
            messages.append(_tool_message(item, index))
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text is not None:
                # Two reasoning items in a row are one turn's thinking, kept whole.
                reasoning = text if reasoning is None else f"{reasoning}\n{text}"
        else:
            raise InvalidRequest(
                f"input[{index}]: item type {kind!r} is not supported by the proxy "
                "(message, function_call, function_call_output and reasoning are)",
                status=422,
            )
    if reasoning is not None:
        # A turn that ended in thought alone: it is still what the model said.
        messages.append(_with_reasoning({"role": "assistant", "content": ""}, reasoning))
    return messages


def _with_reasoning(message: dict[str, Any], text: str) -> dict[str, Any]:
    # vLLM's chat templates read ``reasoning_content``; vLLM >= 0.16 names it ``reasoning``.
    # Both, so the template renders the thinking the model produced.
    message["reasoning_content"] = text
    message["reasoning"] = text
    return message


def _message(item: dict[str, Any], index: int) -> dict[str, Any]:
    given = item.get("role")
    role = _ROLES.get(given) if isinstance(given, str) else None
    if role is None:
        raise InvalidRequest(
            f"input[{index}]: role {given!r} must be one of {', '.join(_ROLES)}",
            status=422,
        )
    return {"role": role, "content": _content(item.get("content"), f"input[{index}].content")}


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content: text parts become one string; images keep a list of parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of parts", status=422)
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise InvalidRequest(
                f"{where}[{i}]: part type {kind!r} is not supported by the proxy "
                "(input_text, output_text, refusal and input_image with image_url are)",
                status=422,
            )
    if all(p["type"] == "text" for p in parts):
        # vLLM joins text parts with newlines too; a plain string suits every chat template.
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_call(item: dict[str, Any], index: int) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
        raise InvalidRequest(
            f"input[{index}]: a function_call needs string 'call_id', 'name' and 'arguments'",
            status=422,
        )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_message(item: dict[str, Any], index: int) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str):
        raise InvalidRequest(
            f"input[{index}]: a function_call_output needs a string 'call_id'", status=422
        )
    if isinstance(output, list):
        output = _content(output, f"input[{index}].output")
        if not isinstance(output, str):
            raise InvalidRequest(
                f"input[{index}].output: only text output is supported", status=422
            )
    if not isinstance(output, str):
        raise InvalidRequest(f"input[{index}].output must be a string", status=422)
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _reasoning_text(item: dict[str, Any]) -> str | None:
    parts = item.get("content") or item.get("summary") or []
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(texts) if texts else None


def chat_tool(tool: Any, index: int) -> dict[str, Any]:
    """A chat tool for a Responses API function tool."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise InvalidRequest(
            f"tools[{index}]: tool type {kind!r} is not supported by the proxy (only function)",
            status=422,
        )
    if not isinstance(tool.get("name"), str):
        raise InvalidRequest(f"tools[{index}]: a function tool needs a string 'name'", status=422)
    function = {
        key: tool[key]
        for key in ("name", "description", "parameters", "strict")
        if tool.get(key) is not None
    }
    return {"type": "function", "function": function}


def chat_tool_choice(choice: Any) -> Any:
    """A chat ``tool_choice`` for a Responses API one."""
    if choice in _TOOL_CHOICE_MODES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequest(
        f"tool_choice {choice!r} is not supported by the proxy "
        "(none, auto, required or {'type': 'function', 'name': ...})",
        status=422,
    )


# -- response: chat completion -> Responses API response --------------------------------------


def chat_to_response(
    completion: Any, params: dict[str, Any], *, upstream: str, model: str | None = None
) -> dict[str, Any]:
    """A Responses API response for the chat ``completion`` answering Responses ``params``.

    ``upstream`` names the server that answered, for the ``ProtocolError`` of a malformed answer.
    """
    choice, message = _first_choice(completion, upstream)
    finish_reason = choice.get("finish_reason")
    incomplete = _INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    item_status = "incomplete" if incomplete else "completed"

    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": _new_id("rs"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
                "status": item_status,
            }
        )
    calls = [
        _function_call(call, i, item_status, upstream, completion)
        for i, call in enumerate(_tool_calls(message, upstream, completion))
    ]
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _protocol(upstream, "choices[0].message.content is not a string", completion)
    parts: list[dict[str, Any]] = []
    if content or not calls:
        # An empty answer without tool calls is still a turn: keep it as an empty message.
        parts.append({"type": "output_text", "text": content or "", "annotations": []})
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append({"type": "refusal", "refusal": refusal})
    if parts:
        output.append(
            {
                "type": "message",
                "id": _new_id("msg"),
                "role": "assistant",
                "status": item_status,
                "content": parts,
            }
        )
    output.extend(calls)

    created = completion.get("created")
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": created if isinstance(created, (int, float)) else time.time(),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "error": None,
        "model": completion.get("model") or model or params.get("model") or "",
        "instructions": params.get("instructions"),
        "output": output,
        "parallel_tool_calls": params.get("parallel_tool_calls", True) is not False,
        "tool_choice": params.get("tool_choice") or "auto",
        "tools": params.get("tools") or [],
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "max_output_tokens": params.get("max_output_tokens"),
        "metadata": params.get("metadata") or {},
        "usage": response_usage(completion.get("usage")),
        UPSTREAM_KEY: _upstream_extras(completion, choice),
    }


def _first_choice(completion: Any, upstream: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if not isinstance(completion, dict):
        raise _protocol(upstream, "the answer is not a JSON object", completion)
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _protocol(upstream, "the answer has no 'choices'", completion)
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise _protocol(upstream, "choices[0] has no 'message' object", completion)
    return choice, choice["message"]


def _tool_calls(message: dict[str, Any], upstream: str, completion: Any) -> list[Any]:
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise _protocol(upstream, "choices[0].message.tool_calls is not a list", completion)
    return calls


def _function_call(
    call: Any, index: int, status: str, upstream: str, completion: Any
) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _protocol(upstream, f"tool_calls[{index}] has no function name", completion)
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        # Some servers send the arguments as an object rather than a JSON string.
        arguments = orjson.dumps(arguments).decode()
    call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
    return {
        "type": "function_call",
        "id": _new_id("fc"),
        "call_id": call_id or _new_id("call"),
        "name": function["name"],
        "arguments": arguments,
        "status": status,
    }


def response_usage(usage: Any) -> dict[str, Any] | None:
    """Responses API usage for chat completion ``usage`` (``None`` if the upstream sent none)."""
    if not isinstance(usage, dict):
        return None
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": _int(prompt_details.get("cached_tokens")),
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _int(completion_details.get("reasoning_tokens"))
        },
        "total_tokens": _int(usage.get("total_tokens")) or prompt + completion,
    }


def _upstream_extras(completion: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    extras: dict[str, Any] = {
        "id": completion.get("id"),
        "finish_reason": choice.get("finish_reason"),
    }
    for key in _COMPLETION_EXTRAS:
        extras[key] = completion.get(key)
    for key in _CHOICE_EXTRAS:
        extras[key] = choice.get(key)
    return extras


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _protocol(upstream: str, problem: str, answer: Any) -> ProtocolError:
    return unusable_answer(upstream, f"with an unusable chat completion: {problem}", answer)


def unusable_answer(upstream: str, what: str, answer: Any) -> ProtocolError:
    """``upstream`` answered ``/v1/chat/completions`` ``what`` (the answer kept as the body)."""
    try:
        body = orjson.dumps(answer)[:4096]
    except TypeError:
        body = repr(answer)[:4096].encode()
    return ProtocolError(
        f"{upstream} answered {CHAT_ENDPOINT} {what}",
        server=upstream,
        endpoint=CHAT_ENDPOINT,
        method="POST",
        body=body,
    )
