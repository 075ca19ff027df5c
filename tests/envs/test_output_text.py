"""``protocol.output_text``: what every env's verifier reads, the same text the ``openai``
package's ``Response.output_text`` and NeMo Gym's verifiers read."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response

from rollgym.errors import InvalidRequest
from rollgym.protocol import output_text

from .env_client import reply


def _message(*parts: dict[str, Any], role: str = "assistant") -> dict[str, Any]:
    return {
        "type": "message",
        "id": "m",
        "role": role,
        "status": "completed",
        "content": list(parts),
    }


def _text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _response(*output: dict[str, Any]) -> dict[str, Any]:
    return {**reply(""), "output": list(output)}


CASES = [
    (_response(), ""),
    (_response(_message(_text("a"))), "a"),
    # every assistant message, joined with nothing between (NeMo Gym's reading)
    (_response(_message(_text("\\boxed{B}")), _message(_text("Hope this helps!"))),
     "\\boxed{B}Hope this helps!"),
    (_response(_message(_text("one "), _text("two"))), "one two"),
    # reasoning, tool calls, their outputs and refusals are not output text
    (_response(
        {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "x"}]},
        {"type": "function_call", "id": "f", "call_id": "c", "name": "t", "arguments": "{}"},
        _message({"type": "refusal", "refusal": "no"}, _text("yes")),
    ), "yes"),
]  # fmt: skip


@pytest.mark.parametrize(("response", "text"), CASES)
def test_output_text_reads_what_openai_reads(response: dict[str, Any], text: str) -> None:
    assert output_text(response) == text
    assert Response.model_validate(response).output_text == text


def test_other_roles_are_skipped() -> None:
    observation = {"type": "message", "role": "user", "content": "the door opens"}
    both = _response(observation, _message(_text("\\boxed{A}")))
    assert output_text(both) == "\\boxed{A}"


def test_an_assistant_message_without_parts_is_refused() -> None:
    plain = {"type": "message", "role": "assistant", "content": "\\boxed{A}"}
    with pytest.raises(InvalidRequest) as caught:
        output_text(_response(plain))
    assert caught.value.status == 422
