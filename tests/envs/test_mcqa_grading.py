"""mcqa grading modes, rule by rule, NeMo Gym 0.4.0's surprises included (each case named), the
row parser's refusals, and the server option that overrides a row's mode. The full table of
NeMo Gym's own verdicts is tests/compat/parity."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rollgym.envs.mcqa.grading import choose
from rollgym.envs.mcqa.server import MCQAEnv
from rollgym.envs.mcqa.task import MCQATask, parse_task
from rollgym.errors import InvalidRequest
from rollgym.testing import serve_server

from .env_client import reply

pytestmark = pytest.mark.timeout(30)

OPTIONS = [{"A": "Cat"}, {"B": "Catalog"}, {"C": "Dog"}, {"D": "Bird"}]


def _row(**fields: Any) -> dict[str, Any]:
    row = {
        "responses_create_params": {"input": "Which animal barks?"},
        "options": OPTIONS,
        "expected_answer": "C",
    }
    row.update(fields)
    return {k: v for k, v in row.items() if v is not None}


def _choose(text: str, mode: str | None = None, **fields: Any) -> str | None:
    task = parse_task(_row(**fields))
    return choose(text, task, mode or task.mode or task.default_mode)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "text", "chosen"),
    [
        ("strict_single_letter_boxed", "\\boxed{C}", "C"),
        ("strict_single_letter_boxed", "\\boxed{(C)}", "C"),
        ("strict_single_letter_boxed", "First \\boxed{A}, then \\boxed{C}", "A"),  # first box
        ("strict_single_letter_boxed", "Answer: C", None),  # the case: no box, no answer
        ("strict_single_letter_boxed", "\\boxed{\\text{C}}", None),  # a wrapper is letters
        ("strict_single_letter_boxed", "\\boxed{c}", None),  # uppercase only
        ("strict_single_letter_boxed", "\\boxed{E}", None),  # no option E
        ("strict_single_letter_boxed", "\\boxed{42}, (C)}", "C"),  # [^A-Za-z] crosses braces
        ("lenient_boxed", "\\boxed{Dog}", "C"),
        ("lenient_boxed", "\\boxed{\\text{dog}}", "C"),
        ("lenient_boxed", "\\boxed{Catalog}", None),  # contains Cat and Catalog: two options
        ("lenient_answer_colon", "Answer: C", "C"),
        ("lenient_answer_colon", "answer: c", "C"),
        ("lenient_answer_colon", "Answer: dog", "C"),
        ("lenient_answer_colon", "Answer: C.", None),  # the whole rest of the line is read
        ("lenient_answer_colon", "**Answer:** C", None),
        ("lenient_answer_colon", "My answer: maybe\nAnswer: C", None),  # the first one counts
        ("lenient_answer_colon_md", "**Answer:** C", "C"),
        ("lenient_answer_colon_md", "__Answer__: c", "C"),
        ("lenient_answer_colon_md", "Answer: Cat", None),
        ("rollgym_lenient", "Answer: C", "C"),
        ("rollgym_lenient", "I'd go with C.", "C"),
        ("rollgym_lenient", "A or C", None),
    ],
)
def test_grading_modes(mode: str, text: str, chosen: str | None) -> None:
    assert _choose(text, mode) == chosen


def test_the_template_regex_comes_first_and_is_trusted() -> None:
    template = {"output_regex": "Final Choice:\\s*([A-Za-z])"}
    assert _choose("\\boxed{A} Final Choice: c", template_metadata=template) == "C"
    # A letter that is no option is still the answer (NeMo Gym trusts the template).
    assert _choose("Final Choice: E", template_metadata=template) == "E"
    # The last match wins; without one, the grading mode decides.
    assert _choose("Final Choice: A. Final Choice: C", template_metadata=template) == "C"
    assert _choose("\\boxed{C}", template_metadata=template) == "C"
    # A capture that is an option's whole text; Arabic and fullwidth letters read as A-D.
    text_template = {"output_regex": ["Choice: (.+)", "Pick: (\\S+)"]}
    assert _choose("Choice:  DOG ", template_metadata=text_template) == "C"
    assert _choose("Pick: \u062c", template_metadata=text_template) == "C"
    assert _choose("Pick: \uff23", template_metadata=text_template) == "C"
    # With no options at all, the template alone grades.
    assert _choose("Final Choice: B", options=None, template_metadata=template) == "B"


def test_a_pattern_that_does_not_compile_falls_back_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A pattern no other test uses: each bad pattern is warned about once per process.
    broken = {"output_regex": "Final pick only: ([A-Z"}
    assert _choose("\\boxed{C}", template_metadata=broken) == "C"
    assert "does not compile" in caplog.text


def test_empty_replies_choose_nothing() -> None:
    for text in ("", "  \n\t", "\n"):
        assert _choose(text, "rollgym_lenient") is None


def test_default_mode_follows_the_row_shape() -> None:
    assert parse_task(_row()).default_mode == "strict_single_letter_boxed"  # NeMo Gym's rows
    rollgym_rows = [{"A": "Cat", "C": "Dog"}, ["Cat", "Bird", "Dog"]]
    for options in rollgym_rows:
        assert parse_task(_row(options=options)).default_mode == "rollgym_lenient"


def test_task_parsing() -> None:
    task = parse_task(
        _row(options=[{"a": "Cat"}, {"B": None}, {"C": "Dog"}], expected_answer=" c ")
    )
    assert task == MCQATask(
        options=(("A", "Cat"), ("C", "Dog")),  # an option with null text is none
        expected="C",
        mode=None,
        default_mode="strict_single_letter_boxed",
        output_regex=None,
    )
    assert parse_task(_row(grading_mode="lenient_boxed")).mode == "lenient_boxed"
    assert parse_task(_row(template_metadata={"output_regex": "x"})).output_regex == ("x",)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"expected_answer": None}, "expected_answer"),
        ({"expected_answer": "E"}, "expected_answer"),
        ({"expected_answer": 3}, "expected_answer"),
        ({"options": [{"A": "Cat"}, {"1": "x"}]}, "'1'"),
        ({"options": [{"C": "Cat"}, {"C": "Dog"}]}, "twice"),
        ({"options": [{"C": 3}]}, "text or null"),
        ({"options": [{"A": None}]}, "no option"),
        ({"options": "ABCD"}, "'options'"),
        ({"grading_mode": "exact"}, "grading_mode"),
        ({"grading_mode": "lenient_answer_colon_md"}, "server option"),
        ({"template_metadata": "x"}, "template_metadata"),
        ({"template_metadata": {"output_regex": None}}, "output_regex"),
        ({"template_metadata": {"output_regex": "(a)(b)"}}, "2 groups"),
    ],
)
def test_rows_that_cannot_be_graded_are_refused(fields: dict[str, Any], message: str) -> None:
    row = _row()
    row.update(fields)
    row = {k: v for k, v in row.items() if not (k == "expected_answer" and v is None)}
    with pytest.raises(InvalidRequest) as caught:
        parse_task(row)
    assert caught.value.status == 422
    assert message in caught.value.message


async def test_the_server_option_overrides_every_rows_mode(
    connect: Callable[..., Any],
) -> None:
    row = _row(grading_mode="strict_single_letter_boxed")
    options = {"grading_mode": "lenient_answer_colon_md"}
    async with serve_server(MCQAEnv, name="mcqa", options=options) as (url, _):
        status, verified = await connect(url).verify(row, "**Answer:** C")
    assert status == 200, verified
    assert (verified["reward"], verified["extracted_answer"], verified["extracted"]) == (
        1.0,
        "C",
        1,
    )
    assert verified["grading_mode"] == "strict_single_letter_boxed"  # the row comes back as sent


async def test_verify_reads_every_assistant_message(connect: Callable[..., Any]) -> None:
    row = _row(grading_mode="strict_single_letter_boxed")
    response = reply("\\boxed{C}")
    chat = {**response["output"][0], "id": "msg_2"}
    chat["content"] = [{"type": "output_text", "text": "Hope this helps!", "annotations": []}]
    response["output"].append(chat)
    async with serve_server(MCQAEnv, name="mcqa") as (url, _):
        status, verified = await connect(url).request(
            "POST", "/verify", {**row, "response": response}
        )
    assert status == 200, verified
    assert verified["reward"] == 1.0  # the case: the last message alone says nothing


async def test_an_unknown_server_mode_is_a_config_error() -> None:
    with pytest.raises(Exception, match="grading_mode"):
        async with serve_server(MCQAEnv, name="mcqa", options={"grading_mode": "exact"}):
            pass
