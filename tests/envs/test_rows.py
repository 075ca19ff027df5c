"""The task-row readers and the verify-field mean the bundled environments share."""

from __future__ import annotations

import pytest

from rollgym.envs.rows import content_texts, expected_text, mean_field, prompt_items
from rollgym.errors import InvalidRequest


def test_expected_text_reads_numbers_as_text_and_refuses_what_is_no_answer() -> None:
    assert expected_text({"expected_answer": "3/4"}, "math") == "3/4"
    assert expected_text({"expected_answer": 12}, "math") == "12"
    for bad in (None, "", "  ", True, ["12"]):
        with pytest.raises(InvalidRequest, match="judge task needs 'expected_answer'") as info:
            expected_text({"expected_answer": bad}, "judge")
        assert info.value.status == 422


def test_prompt_items_and_content_texts() -> None:
    assert prompt_items({"responses_create_params": {"input": "hi"}}) == "hi"
    assert prompt_items({"responses_create_params": {"input": [{"role": "user"}]}}) == [
        {"role": "user"}
    ]
    assert prompt_items({}) == [] and prompt_items({"responses_create_params": {"input": 3}}) == []
    assert content_texts("hi") == ["hi"]
    assert content_texts([{"text": "a"}, "junk", {"type": "input_image"}, {"text": 5}]) == [
        "a",
        "",
        "5",
    ]
    assert content_texts(None) == []


def test_mean_field_over_the_rollouts_that_carry_it() -> None:
    rollouts = [{"hit": 1}, {"hit": 0}, {"hit": True}, {"hit": "yes"}, {}]
    assert mean_field(rollouts, "hit", "hit_rate") == {"hit_rate": pytest.approx(2 / 3)}
    assert mean_field([{}], "hit", "hit_rate") == {}
