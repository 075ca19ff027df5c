"""MCQAEnv: extracting the chosen letter from free text, and the verifier over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rollgym.envs.mcqa.extract import extract_choice
from rollgym.envs.mcqa.server import MCQAEnv, option_letters
from rollgym.errors import InvalidRequest
from rollgym.testing import serve_server

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # boxed, with and without LaTeX text wrappers and math delimiters
        ("\\boxed{B}", "B"),
        ("\\boxed{\\text{B}}", "B"),
        ("$\\boxed{\\textbf{(C)}}$", "C"),
        ("\\boxed{ d }", "D"),
        ("\\boxed{B) Paris}", "B"),
        ("The answer is \\(\\boxed{A}\\).", "A"),
        # answer markers
        ("Answer: B", "B"),
        ("ANSWER: C", "C"),
        ("The answer is (B).", "B"),
        ("the correct answer is D", "D"),
        ("**Answer:** B", "B"),
        ("**Answer: D**", "D"),
        ("The answer is: **A**", "A"),
        ("Final answer: (c)", "C"),
        ("Answer: [C]", "C"),
        ("answer: option B", "B"),
        ("Correct option: D", "D"),
        ("I'd go with C.", "C"),
        ("Answer: B) Paris", "B"),
        ("Answer: B, as explained above.", "B"),
        ("The answer is B, not C.", "B"),
        # lowercase
        ("answer: c", "C"),
        ("b", "B"),
        # endings without a marker
        ("B", "B"),
        ("(B)", "B"),
        ("**B**", "B"),
        ("Let me think. A seems wrong.\n\nB", "B"),
        ("I think it's B)", "B"),
        ("Therefore, B.", "B"),
        # the last explicit answer wins
        ("Answer: A\nWait, actually the answer is C.", "C"),
        ("First \\boxed{A}, then on reflection \\boxed{D}", "D"),
        ("Option A is tempting, but the correct answer is B", "B"),
        ("\\boxed{B}\nAnswer: B", "B"),
    ],
)
def test_extract_choice_reads_the_answer(text: str, expected: str) -> None:
    assert extract_choice(text, "ABCD") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I don't know.",
        "Answer: A or B",
        "It's either A or C.",
        "\\boxed{A, C}",
        "\\boxed{A or C}",
        "The answer is B and C",
        "A or B)",
        "Answer: E",  # not an option
        "\\boxed{x}",
        "\\boxed{Paris}",
        "The answer is a lot harder than it looks.",  # the article, not option A
        "answer is b because of the heat",
        "Answer: I think it's C",  # "I" is the pronoun; no explicit answer follows
        "A) 1\nB) 2\nC) 3\nD) 4",  # restating the options answers nothing
        "Answer: B\nOn second thought, \\boxed{B, D}",  # the last answer is ambiguous
        "\\boxed{A}\nAnswer: C",  # two answers with nothing between them: a hedge
    ],
)
def test_extract_choice_returns_none_when_absent_or_ambiguous(text: str) -> None:
    assert extract_choice(text, "ABCD") is None


def test_extract_choice_honours_the_option_letters() -> None:
    assert extract_choice("Answer: E", "ABCDE") == "E"
    assert extract_choice("Answer: E", ["a", "b", "c", "d"]) is None
    assert extract_choice("Answer: I", "ABCDEFGHIJ") == "I"
    assert extract_choice("\\boxed{C}", "AB") is None


def test_option_letters() -> None:
    assert option_letters({"a": "x", "B": "y"}) == ["A", "B"]
    assert option_letters(["x", "y", "z"]) == ["A", "B", "C"]
    for bad in (None, {}, [], {"AB": "x"}, "ABCD", ["x"] * 27):
        with pytest.raises(InvalidRequest):
            option_letters(bad)


def _task(options: Any, expected: Any = "B") -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "Which is the capital of France?"},
        "options": options,
        "expected_answer": expected,
    }


@pytest.mark.parametrize(
    "options", [{"A": "Lyon", "B": "Paris", "C": "Nice"}, ["Lyon", "Paris", "Nice"]]
)
async def test_verify_rewards_the_right_letter(connect: Callable[..., Any], options: Any) -> None:
    task = _task(options)
    cases = [
        ("\\boxed{B}", 1.0, 1),
        ("Answer: b", 1.0, 1),
        ("Answer: C", 0.0, 1),
        ("Answer: D", 0.0, 0),  # D is no option of this task
        ("Either A or B.", 0.0, 0),
        ("Paris", 0.0, 0),
    ]
    async with serve_server(MCQAEnv, name="mcqa") as (url, _):
        env = connect(url)
        for text, reward, extracted in cases:
            sid = await env.seed(task)
            status, verified = await env.verify(task, text, sid)
            assert status == 200, verified
            assert (verified["reward"], verified["extracted"]) == (reward, extracted), text


async def test_verify_rejects_malformed_tasks(connect: Callable[..., Any]) -> None:
    malformed = [
        _task({"A": "x", "B": "y"}, "E"),
        _task({"A": "x", "B": "y"}, None),
        _task(None),
        {"responses_create_params": {"input": "?"}, "expected_answer": "A"},
    ]
    async with serve_server(MCQAEnv, name="mcqa") as (url, _):
        env = connect(url)
        for task in malformed:
            status, body = await env.verify(task, "\\boxed{A}")
            assert status == 422, task
            assert body["error"]["type"] == "invalid_request"


async def test_aggregate_metrics_reports_the_extraction_rate(
    connect: Callable[..., Any],
) -> None:
    rollouts = [{"reward": 1.0, "extracted": 1}, {"reward": 0.0, "extracted": 0}]
    async with serve_server(MCQAEnv, name="mcqa") as (url, _):
        status, metrics = await connect(url).request(
            "POST", "/aggregate_metrics", {"rollouts": rollouts}
        )
    assert (status, metrics) == (200, {"extraction_rate": 0.5})
