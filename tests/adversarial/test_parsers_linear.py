"""Model text that made a parser of it super-linear (an audit timed each at two sizes): each is
read here at a size that ran past this file's 60 s timeout on the old code (five of the six
did), and must be read at once. pytest-timeout bounds every test; nothing is timed in an
assertion.

- reasoning_gym's guard (``_HUGE``, every dataset's answer): cubic in ``"1_" * n``.
- reasoning_gym's NeMo Gym extraction (first ``\\boxed{...}``): quadratic in unclosed openings.
- mcqa's strict box (NeMo Gym's ``\\boxed{\\s*[^A-Za-z]*...``): quadratic in spaces.
- the local model server's tool-call blocks: quadratic in unclosed ``<tool_call>``.
- the judge's rubric scores (cubic in a judge's ``"[[   ..."``) and its quote removal (quadratic
  in markers that close nothing).
- a streamed completion put back together: quadratic in its chunks.
"""

from __future__ import annotations

import pytest

from rollgym.envs.judge.verdict import Criterion, rubric_scores, without_quotes
from rollgym.envs.mcqa.grading import _strict_boxed
from rollgym.envs.mcqa.task import parse_task
from rollgym.envs.reasoning_gym.extract import extract
from rollgym.envs.reasoning_gym.guard import screen
from rollgym.models.assemble import assemble_chat
from rollgym.models.local_tools import parse_tool_calls
from rollgym.models.tiny import TOOL_CALL_START

pytestmark = pytest.mark.timeout(60)


def test_the_guard_reads_digits_and_underscores_at_once() -> None:
    why = screen(
        "basic_arithmetic", "1_" * 20_000
    )  # 40,000 characters: cubic before (4,800: 123 s)
    assert why is not None and "float's range" in why
    assert screen("basic_arithmetic", "1" * 299 + "x") is None  # 299 digits: a float


def test_nemo_gyms_first_box_is_found_in_one_pass() -> None:
    text = "\\boxed{" * 200_000
    assert extract(text, "nemo_gym") == text.strip()  # no box closes: the whole reply
    assert extract("\\boxed{}\\boxed{ 42 }" + "\\boxed{" * 200_000, "nemo_gym") == "42"


def test_a_strict_box_of_spaces_is_read_at_once() -> None:
    task = parse_task({"options": {"A": "x", "B": "y"}, "expected_answer": "A"})
    assert _strict_boxed("\\boxed{" + " " * 400_000 + "a", task) is None
    assert _strict_boxed("\\boxed{A" + " " * 400_000, task) is None
    assert _strict_boxed("\\boxed{ (A) }", task) == "A"


def test_unclosed_tool_calls_are_text() -> None:
    text = "said " + TOOL_CALL_START * 300_000
    parsed = parse_tool_calls(text)
    assert parsed.content == text and parsed.calls == ()


def test_a_judges_reply_of_brackets_and_markers_is_read_at_once() -> None:
    with pytest.raises(ValueError, match="no score"):
        rubric_scores("[[" + " " * 200_000 + "x", [Criterion("x", "d")], 10)
    assert rubric_scores("[[ x : 7 ]]", [Criterion("x", "d")], 10) == {"x": 0.7}
    markers = "".join(f"<<answer-{i:012x}>>\n" for i in range(50_000))
    assert without_quotes(markers) == markers  # none closes: nothing is a quote


def test_a_long_stream_is_put_together_in_one_pass() -> None:
    piece = {"index": 0, "delta": {"content": "ab"}, "logprobs": {"content": [{"t": 1}]}}
    chunks = [{"id": "c", "choices": [piece]} for _ in range(200_000)]
    chunks.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    done = assemble_chat(chunks, upstream="model")
    choice = done["choices"][0]
    assert len(choice["message"]["content"]) == 400_000
    assert len(choice["logprobs"]["content"]) == 200_000
    assert piece == {"index": 0, "delta": {"content": "ab"}, "logprobs": {"content": [{"t": 1}]}}
