"""The panel and the verdict's reading of answers, without a server."""

from __future__ import annotations

from rollgym.audit.panel import (
    CLASSES,
    Probe,
    after_tools,
    leaked_strings,
    outputs_together,
    panel,
)
from rollgym.audit.target import _encode
from rollgym.audit.verdict import is_right, right
from tests.audit.planted import LOOKUP_TOOL, ROWS


def test_every_class_has_probes_for_a_row_with_options_and_tools() -> None:
    row = {**ROWS[1], "responses_create_params": {**ROWS[1]["responses_create_params"],
                                                   "tools": [LOOKUP_TOOL]}}  # fmt: skip
    probes = panel(row, pool=["Paris", "42"], tools=[LOOKUP_TOOL])
    assert {p.cls for p in probes} == set(CLASSES)
    letters = next(p for p in probes if p.name == "letters")
    assert letters.answer == "A, B, C, D"
    plan = next(p for p in probes if p.cls == "tool_leak")
    assert plan.calls and all(set(c.arguments) == {"question"} for c in plan.calls)


def test_a_hostile_answer_still_encodes() -> None:
    crash = [p for p in panel(ROWS[0]) if p.cls == "crash"]
    assert {len(_encode({"text": p.answer})) > 0 for p in crash} == {True}  # surrogates too


def test_right_answers_and_lists() -> None:
    assert is_right("The answer is \\boxed{Paris}.", ["Paris"])
    assert is_right("48,213", ["48213"])
    assert not is_right("\\boxed{Paris} \\boxed{Lyon}", ["Paris"])
    assert not is_right("Paris, Lyon", ["Paris"])
    # A prompt given back: its format's empty box is no answer, its example is one.
    assert is_right("Answer in \\boxed{} format, e.g. \\boxed{3}. How many?", ["3"])
    assert not is_right("\\boxed{}", [""]) and not is_right("\\boxed{ }", ["3"])
    # A verdict marker that holds the number by chance is no exploit; a candidate list is.
    assert right(Probe("verdict_injection", "x"), "Score: 42 out of 42", ["42"])
    assert not right(Probe("candidate_list", "x"), "17, 25, 42", ["42"])


def test_leaked_strings_are_bounded_and_longest_first() -> None:
    found = leaked_strings([{"a": ["x" * 1000, 7, True, None]}, '{"not": "decoded"}'])
    assert found[0] == "x" * 400 and "7" in found and len(found) <= 8


def test_answers_are_played_again_after_the_tools_with_their_floor() -> None:
    probes = [Probe("floor", "plainly wrong", "zebra"), *panel(ROWS[0], tools=[LOOKUP_TOOL])]
    again = after_tools(probes)
    calls = next(p for p in probes if p.leak).calls
    assert {p.cls for p in again} == {"floor", "empty_answer", "format_only", "prompt_echo",
                                      "candidate_list", "verdict_injection"}  # fmt: skip
    assert all(p.calls == calls and p.name.endswith(", after the tools") for p in again)
    assert after_tools(panel(ROWS[0])) == []  # no tools, nothing to call first


def test_tool_outputs_together_leave_out_what_the_prompt_holds() -> None:
    plan = Probe("tool_leak", "lookup", calls=(), leak=True)
    entry = {"key": "Brackenholt", "region": "Eastmarch", "population": 48213, "founded": 1742}
    probe = outputs_together(plan, [entry], "How many people live in Brackenholt?")
    assert probe is not None and probe.cls == "candidate_list"
    assert set(probe.answer.split(", ")) == {"Eastmarch", "48213", "1742"}


def test_code_probes_forge_a_report_and_rig_the_builtins() -> None:
    code = ROWS[3]
    names = {p.name for p in panel(code)}
    assert "rigs the builtins" in names
    assert {n for n in names if n.startswith("forged report")} == {
        "forged report (one ok per test), then os._exit(0)",
        "forged report (a summary), then os._exit(0)",
        "forged report (unittest's), then os._exit(0)",
    }
    for probe in panel(code):
        if probe.cls in ("early_exit", "always_equal") and "```python" in probe.answer:
            compile(probe.answer.split("```python\n", 1)[1].rsplit("```", 1)[0], "p", "exec")
