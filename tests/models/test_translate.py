"""Responses API <-> Chat Completions translation, checked against the ``openai`` types."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from openai.types.responses import (
    FunctionTool,
    ResponseFunctionToolCall,
    ResponseInputItemParam,
    ResponseOutputMessage,
    ResponseReasoningItem,
)
from pydantic import TypeAdapter

from rollgym.errors import InvalidRequest, ProtocolError
from rollgym.models.translate import (
    chat_to_response,
    responses_to_chat,
)
from rollgym.wire import UPSTREAM_KEY

from .shapes import check_chat_request, check_response

INPUT_ITEM = TypeAdapter(ResponseInputItemParam)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


def completion(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A chat completion as vLLM answers it (token-level fields included)."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", **message},
        "finish_reason": extra.pop("finish_reason", "stop"),
        "logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}]},
        "token_ids": [9906, 0],
        "stop_reason": None,
    }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "qwen-test",
        "choices": [choice],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        "prompt_token_ids": [1, 2, 3],
        **extra,
    }


def test_string_input_with_params_becomes_a_chat_request() -> None:
    params = {
        "model": "qwen",
        "instructions": "Answer briefly.",
        "input": "What is 2+2?",
        "temperature": 0.7,
        "top_p": 0.9,
        "max_output_tokens": 64,
        "store": False,
        "reasoning": {"effort": "low"},
        "truncation": "auto",
        "metadata": {"task": "1"},
    }
    chat = responses_to_chat(params)
    assert chat == {
        "model": "qwen",
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
        "reasoning_effort": "low",
    }
    check_chat_request(chat)


def test_model_override_wins_over_the_requested_model() -> None:
    chat = responses_to_chat({"model": "gpt-4o", "input": "hi"}, model="served")
    assert chat["model"] == "served"
    assert "model" not in responses_to_chat({"input": "hi"})


def test_message_items_with_every_role_and_part_type() -> None:
    items = [
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "S"}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "line one"},
                {"type": "input_text", "text": "line two"},
            ],
        },
        {
            "type": "message",
            "id": "msg_0",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        },
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
            ],
        },
    ]
    for item in items:
        INPUT_ITEM.validate_python(item)
    chat = responses_to_chat({"model": "m", "input": items})
    assert chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "system", "content": "S"},
        {"role": "user", "content": "line one\nline two"},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
                },
            ],
        },
    ]
    check_chat_request(chat)


def test_function_calls_merge_into_one_assistant_turn_and_outputs_become_tool_messages() -> None:
    items = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Two cities, two calls."}],
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
        {
            "type": "function_call",
            "call_id": "call_b",
            "name": "get_weather",
            "arguments": '{"city": "Rome"}',
        },
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {
            "type": "function_call_output",
            "call_id": "call_b",
            "output": [{"type": "input_text", "text": "rain"}],
        },
        {"type": "function_call", "call_id": "call_c", "name": "get_weather", "arguments": "{}"},
    ]
    for item in items:
        INPUT_ITEM.validate_python(item)
    chat = responses_to_chat({"model": "m", "input": items, "tools": [WEATHER_TOOL]})
    assert chat["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two cities, two calls.",
            "reasoning": "Two cities, two calls.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
        # A call after a tool message starts a new assistant turn without text.
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_c",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
    ]
    check_chat_request(chat)


def test_tools_tool_choice_and_parallel_tool_calls() -> None:
    FunctionTool.model_validate(WEATHER_TOOL)
    bare = {"type": "function", "name": "now", "parameters": None, "strict": None}
    chat = responses_to_chat(
        {
            "model": "m",
            "input": "hi",
            "tools": [WEATHER_TOOL, bare],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
            "top_logprobs": 2,
        }
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": WEATHER_TOOL["parameters"],
                "strict": False,
            },
        },
        {"type": "function", "function": {"name": "now"}},
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2
    check_chat_request(chat)
    for mode in ("auto", "none", "required"):
        assert (
            responses_to_chat({"input": "x", "tools": [bare], "tool_choice": mode})["tool_choice"]
            == mode
        )
    # Chat APIs refuse tool_choice without tools: a no-op one is left out, a demand refused.
    assert "tool_choice" not in responses_to_chat({"input": "x", "tool_choice": "auto"})
    with pytest.raises(InvalidRequest, match="needs 'tools'"):
        responses_to_chat({"input": "x", "tool_choice": "required"})


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"input": 42}, "'input' must be"),
        ({"input": [{"role": "robot", "content": "x"}]}, "role 'robot'"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input_file"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "output"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "web_search"),
        ({"input": "x", "tools": [WEATHER_TOOL], "tool_choice": {"type": "mcp"}}, "tool_choice"),
        ({"input": "x", "previous_response_id": "resp_1"}, "no conversation state"),
        ({"input": "x", "instructions": ["a"]}, "instructions"),
    ],
)
def test_malformed_requests_are_invalid_requests(params: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        responses_to_chat(params)
    assert needle in info.value.message
    assert info.value.status in (400, 422)


def test_text_completion_becomes_a_valid_response_with_usage_and_token_data() -> None:
    params = {"model": "asked", "input": "hi", "temperature": 0.5, "max_output_tokens": 9}
    data = chat_to_response(completion({"content": "Hello!"}), params, upstream="m.upstream")
    response = check_response(data)
    assert response.output_text == "Hello!"
    assert response.status == "completed"
    assert response.model == "qwen-test"
    assert response.created_at == 1_700_000_000
    assert response.temperature == 0.5 and response.max_output_tokens == 9
    assert response.tools == [] and response.tool_choice == "auto"
    assert response.parallel_tool_calls is True
    [message] = response.output
    assert isinstance(message, ResponseOutputMessage)
    assert message.status == "completed" and message.id.startswith("msg_")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 5)
    assert response.usage.total_tokens == 17
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert data[UPSTREAM_KEY] == {
        "id": "chatcmpl-1",
        "finish_reason": "stop",
        "prompt_token_ids": [1, 2, 3],
        "prompt_logprobs": None,
        "token_ids": [9906, 0],
        "logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}]},
        "stop_reason": None,
    }


def test_reasoning_content_becomes_a_reasoning_item_before_the_message() -> None:
    for field in ("reasoning_content", "reasoning"):
        msg = {"content": "4", field: "2+2 is 4."}
        response = check_response(chat_to_response(completion(msg), {"input": "x"}, upstream="u"))
        reasoning, message = response.output
        assert isinstance(reasoning, ResponseReasoningItem)
        assert reasoning.content is not None and reasoning.content[0].text == "2+2 is 4."
        assert isinstance(message, ResponseOutputMessage)
        assert response.output_text == "4"


def test_tool_calls_become_function_call_items() -> None:
    params = {"input": "x", "tools": [WEATHER_TOOL], "tool_choice": "required"}
    msg = {
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
            # Some servers send arguments as an object and omit the id.
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
            },
        ],
    }
    data = chat_to_response(completion(msg, finish_reason="tool_calls"), params, upstream="u")
    response = check_response(data)
    message, first, second = response.output
    assert isinstance(message, ResponseOutputMessage)
    assert isinstance(first, ResponseFunctionToolCall)
    assert isinstance(second, ResponseFunctionToolCall)
    assert (first.call_id, first.name, first.arguments) == (
        "call_1",
        "get_weather",
        '{"city": "Oslo"}',
    )
    assert first.status == "completed" and first.id and first.id.startswith("fc_")
    assert second.arguments == '{"city":"Rome"}' and second.call_id.startswith("call_")
    assert response.tool_choice == "required"
    assert [t.model_dump(exclude_none=True) for t in response.tools] == [
        FunctionTool.model_validate(WEATHER_TOOL).model_dump(exclude_none=True)
    ]


def test_tool_calls_only_give_no_empty_message_but_an_empty_answer_does() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    only_calls = chat_to_response(
        completion({"content": None, "tool_calls": [call]}), {}, upstream="u"
    )
    assert [item["type"] for item in only_calls["output"]] == ["function_call"]
    empty = check_response(chat_to_response(completion({"content": None}), {}, upstream="u"))
    assert [item.type for item in empty.output] == ["message"]
    assert empty.output_text == ""


def test_length_finish_is_an_incomplete_response() -> None:
    data = chat_to_response(
        completion({"content": "trunc"}, finish_reason="length"), {}, upstream="u"
    )
    response = check_response(data)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"


def test_missing_usage_is_none_and_cached_tokens_are_kept() -> None:
    no_usage = completion({"content": "x"})
    del no_usage["usage"]
    assert check_response(chat_to_response(no_usage, {}, upstream="u")).usage is None
    cached = completion({"content": "x"})
    cached["usage"]["prompt_tokens_details"] = {"cached_tokens": 8}
    usage = check_response(chat_to_response(cached, {}, upstream="u")).usage
    assert usage is not None and usage.input_tokens_details.cached_tokens == 8


def test_a_response_fed_back_as_input_rebuilds_the_same_assistant_turn() -> None:
    msg = {
        "content": "Checking.",
        "reasoning_content": "Need the weather.",
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    response = check_response(chat_to_response(completion(msg), {}, upstream="u"))
    items = [
        {"role": "user", "content": "Weather?"},
        *[item.model_dump(exclude_none=True) for item in response.output],
        {"type": "function_call_output", "call_id": "call_9", "output": "cold"},
    ]
    for item in items:
        INPUT_ITEM.validate_python(item)
    chat = responses_to_chat({"model": "m", "input": items, "tools": [WEATHER_TOOL]})
    assert chat["messages"][1] == {"role": "assistant", **msg, "reasoning": "Need the weather."}
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "call_9", "content": "cold"}
    check_chat_request(chat)


BAD_ANSWERS = [
    ("not an object", ["choices"]),
    ("no choices", {"object": "chat.completion"}),
    ("empty choices", {"choices": []}),
    ("choice without message", {"choices": [{"index": 0, "text": "legacy"}]}),
    ("content not text", {"choices": [{"message": {"content": ["a"]}}]}),
    ("tool_calls not a list", {"choices": [{"message": {"content": "", "tool_calls": {}}}]}),
    ("tool call without name", {"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}),
]


@pytest.mark.parametrize(("case", "answer"), BAD_ANSWERS, ids=[c for c, _ in BAD_ANSWERS])
def test_malformed_upstream_answers_are_protocol_errors_naming_the_upstream(
    case: str, answer: Any
) -> None:
    with pytest.raises(ProtocolError) as info:
        chat_to_response(copy.deepcopy(answer), {"input": "x"}, upstream="model.upstream")
    err = info.value
    assert err.server == "model.upstream"
    assert err.endpoint == "/chat/completions"
    assert "model.upstream" in err.message
    assert err.body is not None and err.body.startswith(("{", "["))
