"""Hermes tool calls read from model output (``rollgym.models.local_tools``): well-formed calls
become tool calls with the model's own argument text; anything else stays text, never an error."""

from __future__ import annotations

import pytest

from rollgym.models.local_tools import parse_tool_calls

CALL = '<tool_call>{"name": "echo", "arguments": {"text": "v7"}}</tool_call>'


def test_calls_keep_the_arguments_as_written() -> None:
    parsed = parse_tool_calls(
        "Let me look." + CALL + ' <tool_call>{"name":"b","arguments":{"x":1}}</tool_call>\n'
    )
    assert parsed.content == "Let me look."
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("echo", '{"text": "v7"}'),
        ("b", '{"x":1}'),  # not re-serialised: the template renders it back verbatim
    ]
    assert parse_tool_calls(CALL).content is None
    assert parse_tool_calls('<tool_call>{"name": "f"}</tool_call>').calls[0].arguments == "{}"


@pytest.mark.parametrize(
    "text",
    [
        "plain text",
        '<tool_call>{"name": "echo"',  # cut by max_tokens
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>["name"]</tool_call>',
        CALL + " and then some prose",
        CALL + " between " + CALL,
        "</tool_call>" + CALL[: -len("</tool_call>")],
        "<tool_call><tool_call>{}</tool_call></tool_call>",
        '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>',
        "<tool_call>" + "[" * 5000 + "</tool_call>",  # deep nesting: the JSON parser's limit
        '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',  # a lone surrogate
        '<tool_call>{"name": "f", "arguments": {"t": "\\udfff"}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": 1e999}}</tool_call>',  # Python's inf
    ],
)
def test_anything_malformed_is_text(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.calls == () and parsed.content == text


def test_a_decoy_arguments_key_inside_the_call_is_not_taken_for_its_own() -> None:
    # Under ==, true == 1: a nested "arguments": {"flag": 1} would pass for the call's own.
    text = '{"name":"f","note":{"arguments":{"flag":1}},"arguments":{"flag":true}}'
    [call] = parse_tool_calls(f"<tool_call>{text}</tool_call>").calls
    assert call.arguments == '{"flag":true}'
