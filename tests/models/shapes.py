"""Checks of chat requests and Responses API responses against the ``openai`` package's types.

pydantic validates a TypedDict's declared keys but ignores unknown ones and checks ``Iterable``
fields lazily, so the chat request is checked key by key and part by part here.
"""

from __future__ import annotations

from typing import Any, get_type_hints

from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionContentPartParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolChoiceOptionParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsBase,
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from openai.types.responses import Response
from openai.types.shared_params import FunctionDefinition
from pydantic import TypeAdapter

_REQUEST = TypeAdapter(CompletionCreateParamsNonStreaming)
_STREAM_REQUEST = TypeAdapter(CompletionCreateParamsStreaming)
_MESSAGE = TypeAdapter(ChatCompletionMessageParam)
_PART = TypeAdapter(ChatCompletionContentPartParam)
_TOOL_CALL = TypeAdapter(ChatCompletionMessageFunctionToolCallParam)
_TOOL = TypeAdapter(ChatCompletionFunctionToolParam)
_TOOL_CHOICE = TypeAdapter(ChatCompletionToolChoiceOptionParam)
_BY_ROLE: dict[str, Any] = {
    "system": ChatCompletionSystemMessageParam,
    "user": ChatCompletionUserMessageParam,
    "assistant": ChatCompletionAssistantMessageParam,
    "tool": ChatCompletionToolMessageParam,
}
# vLLM/SGLang read the previous turn's reasoning back from this field of an assistant message.
_VLLM_MESSAGE_KEYS = ("reasoning_content", "reasoning")  # vLLM >= 0.16 reads "reasoning"


def _only_known_keys(obj: dict[str, Any], typed_dict: Any, extra: tuple[str, ...] = ()) -> None:
    unknown = set(obj) - set(get_type_hints(typed_dict)) - set(extra)
    assert not unknown, f"{typed_dict.__name__} has no key(s) {sorted(unknown)}: {obj}"


def check_chat_request(request: dict[str, Any], *, extra_keys: tuple[str, ...] = ()) -> None:
    """Fail unless ``request`` is a valid chat completions request (streaming or not)."""
    streaming = request.get("stream") is True
    known = CompletionCreateParamsStreaming if streaming else CompletionCreateParamsBase
    _only_known_keys(request, known, extra_keys)
    (_STREAM_REQUEST if streaming else _REQUEST).validate_python(request)
    for message in request["messages"]:
        _MESSAGE.validate_python(message)
        _only_known_keys(message, _BY_ROLE[message["role"]], _VLLM_MESSAGE_KEYS)
        if isinstance(message.get("content"), list):
            for part in message["content"]:
                _PART.validate_python(part)
        for call in message.get("tool_calls", []):
            _TOOL_CALL.validate_python(call)
            _only_known_keys(call, ChatCompletionMessageFunctionToolCallParam)
    for tool in request.get("tools", []):
        _TOOL.validate_python(tool)
        _only_known_keys(tool["function"], FunctionDefinition)
    if "tool_choice" in request:
        _TOOL_CHOICE.validate_python(request["tool_choice"])


def check_response(data: dict[str, Any]) -> Response:
    """Fail unless ``data`` is a valid Responses API response; return it as the SDK type."""
    return Response.model_validate(data)
