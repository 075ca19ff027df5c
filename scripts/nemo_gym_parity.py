"""Score (row, response) cases with NeMo Gym 0.4.0's own verifiers and write the expected
rewards that rollgym's parity test (tests/compat/parity) checks rollgym's mcqa and math against.

NeMo Gym is not a dependency of rollgym: run this in a separate venv, never in rollgym's.

    ~/.pyenv/versions/3.12.1/bin/python -m venv /tmp/ngvenv
    /tmp/ngvenv/bin/pip install nemo-gym==0.4.0 math-verify==0.8.0
    /tmp/ngvenv/bin/python scripts/nemo_gym_parity.py

Each case is POSTed to the ``/verify`` route of NeMo Gym's own FastAPI app (in process, through
fastapi's TestClient), so its request validation, its response model and its ``output_text`` are
part of what is measured: ``resources_servers/mcqa`` (server config ``grading_mode`` null, or
set where a case says so) and ``resources_servers/math_with_judge`` with ``should_use_judge:
false``. Rows are NeMo Gym's example data (both mcqa files, math's example.jsonl), rollgym's
bundled math rows, and edge rows written here; each is answered in many formats. The output,
tests/compat/parity/nemo_gym_cases.jsonl, holds one case per line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "compat" / "parity" / "nemo_gym_cases.jsonl"
COMMAND = "/tmp/ngvenv/bin/python scripts/nemo_gym_parity.py"

Case = dict[str, Any]

# -- responses -------------------------------------------------------------------------------


def text(t: str) -> dict[str, Any]:
    return {"type": "output_text", "text": t, "annotations": []}


def msg(*parts: str | dict[str, Any]) -> dict[str, Any]:
    content = [text(p) if isinstance(p, str) else p for p in parts]
    return {"type": "message", "role": "assistant", "content": content}


def refusal(t: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": t}


def reasoning(t: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": t}],
        "content": [{"type": "reasoning_text", "text": t}],
    }


def tool_turn(result: str) -> list[dict[str, Any]]:
    return [
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": result},
    ]


def user_msg(t: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}


def response(output: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses API response around ``output``; items get the ids NeMo Gym requires."""
    items = []
    for i, item in enumerate(output):
        items.append(
            {"id": f"item_{i}", **item} if item["type"] != "function_call_output" else item
        )
    return {
        "id": "resp_parity",
        "object": "response",
        "created_at": 0,
        "model": "parity",
        "status": "completed",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": items,
    }


# -- mcqa ------------------------------------------------------------------------------------

FULLWIDTH = dict(zip("ABCD", "\uff21\uff22\uff23\uff24", strict=True))
ARABIC = dict(zip("ABCD", "\u0623\u0628\u062c\u062f", strict=True))


def mcqa_answers(x: str, y: str, t: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Replies to a question whose right letter is ``x`` (text ``t``), wrong letter ``y``."""
    xl = x.lower()
    yield "boxed", [msg(f"\\boxed{{{x}}}")]
    yield "boxed_in_sentence", [msg(f"Step by step... so the answer is \\boxed{{{x}}}.")]
    yield "boxed_math_mode", [msg(f"$\\boxed{{{x}}}$")]
    yield "boxed_parenthesised", [msg(f"\\boxed{{({x})}}")]
    yield "boxed_spaces", [msg(f"\\boxed{{ {x} }}")]
    yield "boxed_text_wrapper", [msg(f"\\boxed{{\\text{{{x}}}}}")]
    yield "boxed_textbf_wrapper", [msg(f"\\boxed{{\\textbf{{{x}}}}}")]
    yield "boxed_lowercase", [msg(f"\\boxed{{{xl}}}")]
    yield "boxed_letter_dot_text", [msg(f"\\boxed{{{x}. {t}}}")]
    yield "boxed_option_text", [msg(f"\\boxed{{{t}}}")]
    yield "boxed_option_text_wrapped", [msg(f"\\boxed{{\\text{{{t}}}}}")]
    yield "boxed_option_text_lower", [msg(f"The answer: \\boxed{{{t.lower()}}}")]
    yield "boxed_two_letters", [msg(f"\\boxed{{{x}, {y}}}")]
    yield "boxed_wrong_then_right", [msg(f"First \\boxed{{{y}}}, no: \\boxed{{{x}}}")]
    yield "boxed_right_then_wrong", [msg(f"First \\boxed{{{x}}}, no: \\boxed{{{y}}}")]
    yield "boxed_not_an_option", [msg("\\boxed{Z}")]
    yield "boxed_number_then_letter", [msg(f"\\boxed{{42}} and then {x}}}")]
    yield "boxed_wrong", [msg(f"\\boxed{{{y}}}")]
    yield "answer_colon", [msg(f"Answer: {x}")]
    yield "answer_colon_period", [msg(f"Answer: {x}.")]
    yield "answer_colon_lowercase", [msg(f"answer: {xl}")]
    yield "answer_colon_newline", [msg(f"Answer:\n{x}")]
    yield "answer_colon_md_label", [msg(f"**Answer:** {x}")]
    yield "answer_colon_md_all", [msg(f"**Answer: {x}**")]
    yield "answer_colon_md_underscore", [msg(f"__Answer__: {x}")]
    yield "answer_colon_boxed", [msg(f"Answer: \\boxed{{{x}}}")]
    yield "answer_colon_text_wrapper", [msg(f"Answer: \\text{{{x}}}")]
    yield "answer_colon_option_text", [msg(f"Answer: {t}")]
    yield "answer_colon_option_text_shouted", [msg(f"Answer: {t.upper()}")]
    yield "answer_colon_then_more_lines", [msg(f"Answer: {x}\nBecause it fits best.")]
    yield "answer_colon_wrong_then_right", [msg(f"Answer: {y}\nWait, no. Answer: {x}")]
    yield "answer_colon_wrong", [msg(f"Answer: {y}")]
    yield "final_answer_colon", [msg(f"Final answer: {x}")]
    yield "answer_colon_fullwidth", [msg(f"Answer: {FULLWIDTH.get(x, x)}")]
    yield "the_answer_is", [msg(f"The answer is {x}.")]
    yield "bare_letter", [msg(x)]
    yield "parenthesised_letter", [msg(f"({x})")]
    yield "option_selected", [msg(f"Option Selected: {x}")]
    yield "answer_is_shouted", [msg(f"ANSWER IS {x}")]
    yield "final_choice", [msg(f"Final Choice: {x}")]
    yield "final_choice_lowercase", [msg(f"final choice: {xl}")]
    yield "empty_text", [msg("")]
    yield "whitespace_only", [msg("  \n\t ")]
    yield "no_output", []
    yield "no_answer", [msg("I am not sure; all options look plausible.")]
    # Several output items: all assistant text counts, joined with nothing between.
    yield "multi_boxed_then_chat", [msg(f"\\boxed{{{x}}}"), msg("Hope this helps!")]
    yield "multi_answer_colon_then_chat", [msg(f"Answer: {x}"), msg("Hope this helps!")]
    yield "multi_answer_colon_newline_then_chat", [msg(f"Answer: {x}\n"), msg("Hope this helps!")]
    yield "multi_think_then_boxed", [msg("Let me think."), msg(f"\\boxed{{{x}}}")]
    yield "multi_boxed_wrong_then_right", [msg(f"\\boxed{{{y}}}"), msg(f"\\boxed{{{x}}}")]
    yield "multi_parts_one_message", [msg("The answer is ", f"\\boxed{{{x}}}", ".")]
    yield "multi_option_selected_then_chat", [msg(f"Option Selected: {x}"), msg("Thanks!")]
    yield "reasoning_wrong_then_boxed", [reasoning(f"\\boxed{{{y}}}"), msg(f"\\boxed{{{x}}}")]
    yield "reasoning_only", [reasoning(f"\\boxed{{{x}}}. Answer: {x}")]
    yield "tool_output_then_boxed", [*tool_turn(f"\\boxed{{{y}}}"), msg(f"\\boxed{{{x}}}")]
    yield "refusal_part_and_text", [msg(refusal(f"\\boxed{{{y}}}"), text(f"\\boxed{{{x}}}"))]
    yield "refusal_only", [msg(refusal(f"\\boxed{{{x}}}"))]
    yield "user_message_in_output", [user_msg(f"\\boxed{{{y}}}"), msg(f"\\boxed{{{x}}}")]


def _letters(row: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, v) for entry in row["options"] for k, v in entry.items()]


def mcqa_cases(nemo_data: Path) -> Iterator[Case]:
    plain = _jsonl(nemo_data / "mcqa" / "data" / "example.jsonl")
    templated = _jsonl(nemo_data / "mcqa" / "data" / "example_with_template_metadata.jsonl")
    variants: list[tuple[str, list[dict[str, Any]], dict[str, Any], dict[str, Any]]] = [
        # (name, rows, fields set on each row, server config)
        ("example", plain, {}, {}),
        ("example/lenient_boxed", plain, {"grading_mode": "lenient_boxed"}, {}),
        ("example/lenient_answer_colon", plain, {"grading_mode": "lenient_answer_colon"}, {}),
        ("example/no_mode", plain[:1], {"grading_mode": None}, {}),
        ("example/server_md", plain[:3], {}, {"grading_mode": "lenient_answer_colon_md"}),
        ("example/server_lenient_boxed", plain[:1], {}, {"grading_mode": "lenient_boxed"}),
        ("template", templated, {}, {}),
        (
            "template/lenient_answer_colon",
            templated[:2],
            {"grading_mode": "lenient_answer_colon"},
            {},
        ),
        ("template/server_md", templated[:2], {}, {"grading_mode": "lenient_answer_colon_md"}),
    ]
    for name, rows, fields, config in variants:
        for i, row in enumerate(rows):
            row = _set(row, fields)
            options = _letters(row)
            x = row["expected_answer"]
            y = next(k for k, _ in options if k != x)
            t = dict(options)[x]
            for answer, output in mcqa_answers(x, y, t):
                yield _case(f"mcqa/{name}/{i}/{answer}", "mcqa", row, output, config)

    # The same row with rollgym's own shapes of options, graded in an explicit mode: NeMo Gym
    # refuses these shapes, so it scores the row written its way (``nemo_row``).
    base = plain[0]
    options = _letters(base)
    x = base["expected_answer"]
    y = next(k for k, _ in options if k != x)
    t = dict(options)[x]
    for shape, value in [("dict", dict(options)), ("texts", [v for _, v in options])]:
        for mode in ("strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"):
            row = _set(base, {"options": value, "grading_mode": mode})
            nemo_row = _set(base, {"grading_mode": mode})
            for answer, output in mcqa_answers(x, y, t):
                case = _case(f"mcqa/options_{shape}/{mode}/{answer}", "mcqa", row, output, {})
                yield {**case, "nemo_row": nemo_row}
    yield from mcqa_edge_cases(base)


def mcqa_edge_cases(base: dict[str, Any]) -> Iterator[Case]:
    abcd = [{"A": "Cat"}, {"B": "Catalog"}, {"C": "Dog"}, {"D": "Bird"}]
    row = _set(base, {"options": abcd, "expected_answer": "C"})
    regex = "Final Choice:\\s*([A-Za-z])"

    def edge(name: str, fields: dict[str, Any], *outputs: tuple[str, list[Any]]) -> Iterator[Case]:
        for answer, output in outputs:
            yield _case(f"mcqa/edge/{name}/{answer}", "mcqa", _set(row, fields), output, {})

    boxed = ("boxed_c", [msg("\\boxed{C}")])
    yield from edge(
        "null_option_text",
        {"options": [{"A": "Cat"}, {"B": None}, {"C": "Dog"}]},
        ("boxed_b", [msg("\\boxed{B}")]),
        boxed,
    )
    yield from edge(
        "no_options_with_template",
        {"options": None, "template_metadata": {"output_regex": regex}},
        ("final_choice_c", [msg("Final Choice: C")]),
        ("final_choice_e", [msg("Final Choice: E")]),
        boxed,
    )
    yield from edge(
        "template_letter_not_an_option",
        {"template_metadata": {"output_regex": regex}},
        ("final_choice_e", [msg("Final Choice: E")]),
        ("final_choice_c", [msg("Final Choice: C")]),
        ("final_choice_then_boxed", [msg("Final Choice: E. Or \\boxed{C}")]),
    )
    yield from edge(
        "expected_not_an_option_template",
        {"expected_answer": "E", "template_metadata": {"output_regex": regex}},
        ("final_choice_e", [msg("Final Choice: E")]),
    )
    yield from edge(
        "regex_list",
        {"template_metadata": {"output_regex": ["Option Selected:\\s*([A-Z])", "<([A-Z])>"]}},
        ("first_pattern", [msg("Option Selected: C")]),
        ("second_pattern", [msg("I pick <C>")]),
        ("both_last_wins_per_pattern", [msg("<A> then Option Selected: B and <C>")]),
        boxed,
    )
    yield from edge("regex_empty_list", {"template_metadata": {"output_regex": []}}, boxed)
    yield from edge(
        "regex_invalid",
        {"template_metadata": {"output_regex": "Answer: ([A-Z"}},
        boxed,
        ("answer_colon_c", [msg("Answer: C")]),
    )
    yield from edge(
        "regex_two_groups",
        {"template_metadata": {"output_regex": "(Answer): ([A-Z])"}},
        ("matching", [msg("Answer: C")]),
        ("not_matching", [msg("\\boxed{C}")]),
    )
    yield from edge(
        "regex_no_group",
        {"template_metadata": {"output_regex": "Answer: [A-Z]"}},
        ("answer_colon_c", [msg("Answer: C")]),
        ("answer_colon_c_and_box", [msg("Answer: C \\boxed{C}")]),
    )
    yield from edge(
        "regex_option_text",
        {"template_metadata": {"output_regex": "Choice: (.+)"}},
        ("text", [msg("Choice: dog")]),
        ("text_spaced", [msg("Choice:   DOG  ")]),
        ("other_text", [msg("Choice: a dog")]),
    )
    yield from edge(
        "regex_other_scripts",
        {"template_metadata": {"output_regex": "Answer:\\s*(\\S+)"}},
        ("arabic", [msg(f"Answer: {ARABIC['C']}")]),
        ("fullwidth", [msg(f"Answer: {FULLWIDTH['C']}")]),
        ("latin", [msg("Answer: c")]),
    )
    yield from edge(
        "regex_case_insensitive",
        {"template_metadata": {"output_regex": "FINAL CHOICE:\\s*([A-Z])"}},
        ("lower", [msg("final choice: c")]),
    )
    yield from edge("template_without_regex", {"template_metadata": {"template_id": "x"}}, boxed)
    yield from edge("regex_null", {"template_metadata": {"output_regex": None}}, boxed)
    yield from edge("template_not_an_object", {"template_metadata": "x"}, boxed)
    yield from edge(
        "lenient_boxed_two_options_contained",
        {"grading_mode": "lenient_boxed", "expected_answer": "B"},
        ("catalog", [msg("\\boxed{Catalog}")]),
        ("cat", [msg("\\boxed{Cat}")]),
        ("dog_sentence", [msg("\\boxed{It is the Dog}")]),
    )
    yield from edge(
        "answer_colon_first_occurrence",
        {"grading_mode": "lenient_answer_colon"},
        ("first_wins", [msg("My answer: maybe A\nAnswer: C")]),
        ("option_text", [msg("Answer: dog")]),
        ("option_text_twice_spaced", [msg("Answer:   Dog  ")]),
    )
    yield from edge("expected_lowercase_spaced", {"expected_answer": " c "}, boxed)
    yield from edge("expected_missing", {"expected_answer": None}, boxed)
    yield from edge("expected_not_an_option", {"expected_answer": "Z"}, boxed)
    yield from edge("expected_not_text", {"expected_answer": 3}, boxed)
    yield from edge("mode_null", {"grading_mode": None}, boxed)
    yield from edge("mode_unknown", {"grading_mode": "exact"}, boxed)
    yield from edge("mode_md_in_row", {"grading_mode": "lenient_answer_colon_md"}, boxed)
    yield from edge(
        "option_key_not_a_letter", {"options": [{"A": "Cat"}, {"1": "x"}, {"C": "Dog"}]}, boxed
    )
    yield from edge(
        "option_letter_twice", {"options": [{"A": "Cat"}, {"C": "Bird"}, {"C": "Dog"}]}, boxed
    )
    yield from edge(
        "options_lowercase_keys", {"options": [{"a": "Cat"}, {"b": "Dog"}, {"c": "Bird"}]}, boxed
    )
    # rollgym's own row shapes with no grading_mode: NeMo Gym refuses them outright.
    yield from edge("rollgym_dict_options", {"options": {"A": "Cat", "C": "Dog"}}, boxed)
    yield from edge("rollgym_text_options", {"options": ["Cat", "Bird", "Dog"]}, boxed)
    # A message whose content is a string is no Responses API output item.
    yield from edge(
        "string_content",
        {},
        ("assistant", [{"type": "message", "role": "assistant", "content": "\\boxed{C}"}]),
    )


# -- math ------------------------------------------------------------------------------------

MATH_EDGE_ROWS: list[tuple[str, str, list[str]]] = [
    # (name, expected_answer, replies)
    (
        "half",
        "\\frac{1}{2}",
        [
            "\\boxed{\\frac{1}{2}}",
            "\\boxed{0.5}",
            "\\boxed{1/2}",
            "\\boxed{\\dfrac{1}{2}}",
            "\\boxed{\\frac{2}{4}}",
            "\\boxed{50\\%}",
            "\\boxed{0.5000001}",
            "\\boxed{0.49}",
            "The answer is 1/2.",
            "The answer is $\\frac{1}{2}$.",
            "So x = 0.5",
            "1/2",
        ],
    ),
    ("dollars", "$\\frac{3}{4}$", ["\\boxed{0.75}", "$\\frac{3}{4}$", "\\boxed{3/4}"]),
    ("parens", "\\(\\sqrt{2}\\)", ["\\boxed{\\sqrt{2}}", "\\boxed{1.414214}", "\\boxed{2^{1/2}}"]),
    ("boxed_gold", "\\boxed{4}", ["\\boxed{4}", "4", "\\boxed{5}"]),
    ("percent", "10\\%", ["\\boxed{10\\%}", "\\boxed{10}", "\\boxed{0.1}", "\\boxed{11\\%}"]),
    ("poly", "x^2+6x+9", ["\\boxed{(x+3)^2}", "\\boxed{x^2 + 6x + 9}", "\\boxed{x^2+9}"]),
    ("pair", "2, 3", ["\\boxed{3, 2}", "\\boxed{2,3}", "\\boxed{\\{2, 3\\}}", "\\boxed{2}"]),
    ("interval", "(-2, 2)", ["\\boxed{(-2,2)}", "\\boxed{[-2, 2]}", "x \\in (-2, 2)"]),
    ("pi", "\\pi", ["\\boxed{\\pi}", "\\boxed{3.14159265}", "\\boxed{3.14}"]),
    ("equation", "x = 6", ["\\boxed{6}", "\\boxed{x=6}", "\\boxed{y = 6}"]),
    ("thousands", "1024", ["\\boxed{1,024}", "\\boxed{1024.0}", "\\boxed{1 024}"]),
    ("text_answer", "\\text{yes}", ["\\boxed{\\text{yes}}", "\\boxed{yes}", "\\boxed{no}"]),
    ("negative", "-3", ["\\boxed{-3}", "x = -3", "\\boxed{3}", "$-3$"]),
    ("unparseable_gold", "}", ["\\boxed{1}"]),
    ("empty_gold", "", ["\\boxed{1}"]),
]


def math_answers(expected: str, right: str, wrong: str) -> Iterator[tuple[str, list[Any]]]:
    """Replies to a problem whose answer is ``right`` (as LaTeX), with a wrong one."""
    yield "boxed", [msg(f"The answer is $\\boxed{{{right}}}$.")]
    yield "boxed_bare", [msg(f"\\boxed{{{right}}}")]
    yield "unboxed", [msg(f"The answer is ${right}$.")]
    yield "unboxed_plain", [msg(f"So the answer is {right}")]
    yield "wrong_boxed", [msg(f"\\boxed{{{wrong}}}")]
    yield "boxed_wrong_then_right", [msg(f"First \\boxed{{{wrong}}}, then \\boxed{{{right}}}")]
    yield "boxed_right_then_wrong", [msg(f"First \\boxed{{{right}}}, then \\boxed{{{wrong}}}")]
    yield "no_answer", [msg("I need more time to solve this.")]
    yield "empty", [msg("")]
    yield "no_output", []
    yield "multi_boxed_then_chat", [msg(f"\\boxed{{{right}}}"), msg("Hope this helps!")]
    yield "multi_think_then_boxed", [msg("Let me think."), msg(f"\\boxed{{{right}}}")]
    yield "multi_right_then_wrong", [msg(f"\\boxed{{{right}}}"), msg(f"Or \\boxed{{{wrong}}}")]
    yield "reasoning_only", [reasoning(f"\\boxed{{{right}}}"), msg("Done.")]
    yield (
        "reasoning_wrong_then_right",
        [reasoning(f"\\boxed{{{wrong}}}"), msg(f"\\boxed{{{right}}}")],
    )
    yield "tool_output_right", [*tool_turn(f"\\boxed{{{right}}}"), msg("Done.")]
    yield "refusal_right", [msg(refusal(f"\\boxed{{{right}}}"))]


def math_cases(nemo_data: Path) -> Iterator[Case]:
    wrong_for = {"32": "31", "-3": "3"}
    for i, row in enumerate(_jsonl(nemo_data / "math_with_judge" / "data" / "example.jsonl")):
        right = _strip_delims(row["expected_answer"])
        wrong = wrong_for.get(right, "7")
        for answer, output in math_answers(row["expected_answer"], right, wrong):
            yield _case(f"math/example/{i}/{answer}", "math", row, output, {})
    for name, expected, replies in MATH_EDGE_ROWS:
        row = _math_row(expected)
        for j, reply in enumerate(replies):
            yield _case(f"math/edge/{name}/{j}", "math", row, [msg(reply)], {})
    plain = _math_row("\\frac{1}{2}")
    no_question = _set(plain, {"question": None})
    yield _case("math/edge/no_question", "math", no_question, [msg("\\boxed{0.5}")], {})
    number = _set(plain, {"expected_answer": 42})
    yield _case("math/edge/number_gold", "math", number, [msg("\\boxed{42}")], {})
    yield _case(
        "math/edge/string_content",
        "math",
        plain,
        [{"type": "message", "role": "assistant", "content": "\\boxed{0.5}"}],
        {},
    )
    # rollgym's bundled rows with every scripted reply; NeMo Gym needs 'question' as well.
    bundled = ROOT / "src" / "rollgym" / "envs" / "math" / "data" / "example.jsonl"
    for i, row in enumerate(_jsonl(bundled)):
        script = json.loads(row["responses_create_params"]["metadata"]["rollgym_script"])
        row = {**row, "question": row["responses_create_params"]["input"][0]["content"]}
        for j, say in enumerate(script[-1]["say"]):
            yield _case(f"math/rollgym/{i}/{j}", "math", row, [msg(say)], {})


def _math_row(expected: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Solve."}]},
        "question": "Solve.",
        "expected_answer": expected,
    }


def _strip_delims(s: str) -> str:
    s = s.strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2].strip()
    return s


# -- running NeMo Gym ------------------------------------------------------------------------


class NeMoGym:
    """NeMo Gym's mcqa and math_with_judge apps, in process."""

    def __init__(self) -> None:
        from unittest.mock import MagicMock

        from fastapi.testclient import TestClient
        from nemo_gym.server_utils import ServerClient
        from resources_servers.math_with_judge.app import (
            LibraryJudgeMathResourcesServer,
            LibraryJudgeMathResourcesServerConfig,
        )
        from resources_servers.mcqa.app import MCQAResourcesServer, MCQAResourcesServerConfig

        def no_peers() -> Any:
            return MagicMock(spec=ServerClient)  # the judge is off: no other server is called

        def client(server: Any) -> Any:
            return TestClient(server.setup_webserver(), raise_server_exceptions=False)

        def mcqa(mode: str | None) -> Any:
            config = MCQAResourcesServerConfig(
                host="127.0.0.1", port=0, entrypoint="", name="mcqa", grading_mode=mode
            )
            return client(MCQAResourcesServer(config=config, server_client=no_peers()))

        self._mcqa = mcqa
        self._mcqa_clients: dict[str | None, Any] = {}
        math_config = LibraryJudgeMathResourcesServerConfig(
            host="127.0.0.1",
            port=0,
            entrypoint="",
            name="math",
            judge_model_server={"type": "responses_api_models", "name": "judge"},
            judge_responses_create_params={"input": []},
            should_use_judge=False,
        )
        math = LibraryJudgeMathResourcesServer(config=math_config, server_client=no_peers())
        self._math = client(math)

    def verify(self, case: Case) -> dict[str, Any]:
        row = case.get("nemo_row", case["row"])
        if case["env"] == "mcqa":
            mode = case["server_options"].get("grading_mode")
            if mode not in self._mcqa_clients:
                self._mcqa_clients[mode] = self._mcqa(mode)
            client = self._mcqa_clients[mode]
        else:
            client = self._math
        answer = client.post("/verify", json={**row, "response": response(case["output"])})
        if answer.status_code != 200:
            return {"status": answer.status_code}
        body = answer.json()
        out = {"status": 200, "reward": body["reward"]}
        if case["env"] == "mcqa":
            out["extracted_answer"] = body.get("extracted_answer")
        return out


# -- helpers and main ------------------------------------------------------------------------


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _set(row: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``fields`` set; a field set to None is removed."""
    out = {**row, **fields}
    return {k: v for k, v in out.items() if not (k in fields and v is None)}


def _case(
    case_id: str, env: str, row: dict[str, Any], output: list[Any], server_options: dict[str, Any]
) -> Case:
    return {
        "id": case_id,
        "env": env,
        "server_options": server_options,
        "row": row,
        "output": output,
    }


def _versions() -> dict[str, str]:
    names = ["nemo-gym", "math-verify", "latex2sympy2_extended", "sympy", "openai", "pydantic"]
    return {name: importlib.metadata.version(name) for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args(argv)

    import resources_servers.mcqa.app

    nemo_data = Path(resources_servers.mcqa.app.__file__).parents[1]
    cases = [*mcqa_cases(nemo_data), *math_cases(nemo_data)]
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    gym = NeMoGym()
    for n, case in enumerate(cases, 1):
        case["nemo"] = gym.verify(case)
        if n % 200 == 0:
            print(f"{n}/{len(cases)}", file=sys.stderr)
    # Rows repeat across cases: they are stored once, and cases name them.
    rows: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for case in cases:
        for field in ("row", "nemo_row"):
            if field in case:
                blob = json.dumps(case[field], sort_keys=True, ensure_ascii=False)
                key = keys.setdefault(blob, f"r{len(keys)}")
                rows[key] = case[field]
                case[field] = key
    header = {
        "about": "Expected rewards of NeMo Gym 0.4.0 (resources_servers/mcqa, and "
        "resources_servers/math_with_judge with should_use_judge false) for rollgym's parity "
        "test. Each case's 'nemo' is NeMo Gym's own /verify answer (its FastAPI app in process): "
        "status, and reward (and mcqa's extracted_answer) when the status is 200. 'row' names "
        "a row in 'rows'; 'nemo_row', where present, is the row NeMo Gym was sent instead (the "
        "same task with options in its shape); 'output' is the response's output items, "
        "wrapped as scripts/nemo_gym_parity.py:response() does.",
        "command": COMMAND,
        "setup": "~/.pyenv/versions/3.12.1/bin/python -m venv /tmp/ngvenv && "
        "/tmp/ngvenv/bin/pip install nemo-gym==0.4.0 math-verify==0.8.0",
        "python": platform.python_version(),
        "versions": _versions(),
    }
    lines = [json.dumps({"header": header, "rows": rows}, ensure_ascii=False, sort_keys=True)]
    lines += [json.dumps(case, ensure_ascii=False, sort_keys=True) for case in cases]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{args.output}: {len(cases)} cases, {len(rows)} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
