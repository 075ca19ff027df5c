"""Sampling parameters from a row's ``responses_create_params`` to the chat request:
translated, passed through, or refused; never dropped."""

from __future__ import annotations

from typing import Any

import pytest

from rollgym.errors import InvalidRequest
from rollgym.models.translate import responses_to_chat

from .shapes import check_chat_request

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}


def test_each_parameter_reaches_the_chat_request() -> None:
    params: dict[str, Any] = {
        "model": "m",
        "input": "hi",
        "tools": [TOOL],
        "temperature": 0.6,
        "top_p": 0.95,
        "max_output_tokens": 128,
        "seed": 7,
        "stop": ["</answer>"],
        "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
        "top_k": 20,  # vLLM's own: passed through as it is
        "chat_template_kwargs": {"enable_thinking": False},
    }
    chat = responses_to_chat(params)
    assert {k: v for k, v in chat.items() if k not in ("model", "messages", "tools")} == {
        "temperature": 0.6,
        "top_p": 0.95,
        "max_tokens": 128,
        "seed": 7,
        "stop": ["</answer>"],
        "parallel_tool_calls": False,
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "object"}},
        },
        "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    check_chat_request(chat, extra_keys=("top_k", "chat_template_kwargs"))


@pytest.mark.parametrize(
    "params",
    [
        {"max_tool_calls": 2},
        {"background": True},
        {"text": {"format": {"type": "grammar"}}},
        {"tool_choice": {"type": "function", "name": "f"}},  # no tools to choose from
    ],
)
def test_what_has_no_chat_counterpart_is_refused(params: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        responses_to_chat({"input": "hi", **params})


def test_bookkeeping_fields_do_not_reach_the_upstream() -> None:
    chat = responses_to_chat(
        {
            "input": "hi",
            "store": False,
            "metadata": {"a": "b"},
            "truncation": "disabled",
            "background": False,
            "stream": True,
            "user": "u",
        }
    )
    assert set(chat) == {"messages"}


def test_a_trailing_reasoning_item_is_kept_as_the_assistant_turn() -> None:
    items = [
        {"role": "user", "content": "hi"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Hmm."}],
        },
    ]
    [_, last] = responses_to_chat({"input": items})["messages"]
    assert last == {"role": "assistant", "content": "", "reasoning_content": "Hmm.",
                    "reasoning": "Hmm."}  # fmt: skip
