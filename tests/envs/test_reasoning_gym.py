"""ReasoningGymEnv: entries carried exactly, answers read as reasoning-gym reads them, scorers
run in the CPU pool where a slow, crashing or code-running answer cannot hurt the server."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from reasoning_gym.utils import extract_answer

from rollgym.envs.reasoning_gym.carry import NotCarried, carry, restore
from rollgym.envs.reasoning_gym.extract import answer_block, extract, says_nothing
from rollgym.envs.reasoning_gym.guard import screen
from rollgym.envs.reasoning_gym.server import ReasoningGymEnv
from rollgym.envs.reasoning_gym.tasks import DatasetChoice, make_rows
from rollgym.testing import serve_server

from .env_client import reply
from .rg_hanging import DIE, HANG, misbehaving_score

pytestmark = pytest.mark.timeout(90)


def _row(dataset: str, index: int = 0, **config: Any) -> dict[str, Any]:
    rows = list(make_rows([DatasetChoice(dataset, config=config)], index + 1, seed=0))
    return rows[index]


# -- carrying an entry through JSON ---------------------------------------------------------


def test_carry_restores_tuples_int_keys_and_numpy_values() -> None:
    entry = {
        "question": "q",
        "answer": "a",
        "metadata": {
            "board": ((1, 2), (3, 4)),
            "mixed": ((1, [2, (3,)]), "x"),
            "colors": {0: 1, 7: (2, 3)},
            "np": [np.float64(0.5), np.str_("s"), np.int64(3)],
        },
    }
    plain, patches = carry(entry)
    back = restore(json.loads(json.dumps(plain)), json.loads(json.dumps(patches)))
    assert back == entry
    assert back["metadata"]["board"] == ((1, 2), (3, 4))
    assert isinstance(back["metadata"]["mixed"][0][1][1], tuple)
    assert isinstance(back["metadata"]["mixed"][0][1], list)
    assert list(back["metadata"]["colors"]) == [0, 7]
    assert type(back["metadata"]["np"][0]) is float
    # one patch for a board of tuples, not one per row
    assert [["metadata", "board"], "tuples"] in patches
    assert not any(p[0][:2] == ["metadata", "board"] and len(p[0]) > 2 for p in patches)


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, {1, 2}, object(), {(1, 2): "tuple key"}, {1: "a", "1": "b"}],
)
def test_a_value_json_cannot_hold_is_refused_with_its_path(value: Any) -> None:
    with pytest.raises(NotCarried, match=r"entry\['metadata'\]\['v'\]"):
        carry({"question": "q", "answer": "a", "metadata": {"v": value}})


@pytest.mark.parametrize(
    "patches",
    [
        "not a list",
        [["metadata", "tuple"]],
        [[["metadata", "nope"], "tuple"]],
        [[["metadata", "x"], "frozenset"]],
        [[["metadata", "x"], "int_keys"]],
        [[["metadata", "d"], "int_keys"]],
        [[["metadata", "x"], "tuple"], [["metadata", "x", 0], "tuple"]],
    ],
)
def test_a_patch_that_does_not_fit_is_a_value_error(patches: Any) -> None:
    plain = {"metadata": {"x": [[1], [2]], "d": {"a": 1}}}
    with pytest.raises(ValueError, match="restore"):
        restore(plain, patches)


# -- reading the answer ---------------------------------------------------------------------

TOKENS = ["<answer>", "</answer>", " ", "\n", "x", "42", "<answer", "answer>", "\t", "\u2003"]


def test_answer_block_agrees_with_reasoning_gyms_regex() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        text = "".join(rng.choice(TOKENS) for _ in range(rng.randint(0, 14)))
        assert answer_block(text) == extract_answer(text), repr(text)


def test_the_last_block_counts_and_a_nested_tag_is_text() -> None:
    assert answer_block("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert answer_block("<answer><answer>4</answer></answer>") == "<answer>4"
    assert answer_block("no tags: 42") is None
    assert extract("no tags: \\boxed{42}", "answer_tag") is None
    assert extract("no tags: \\boxed{42}", "nemo_gym") == "42"
    assert extract("just 42 ", "nemo_gym") == "just 42"
    assert extract("  ", "nemo_gym") is None


def test_many_openings_without_a_closing_are_read_in_one_pass() -> None:
    # reasoning-gym's regex scans the rest of the text from each opening: quadratic, minutes
    # on this; one pass finds no block. (pytest-timeout bounds it; no timed assertion.)
    assert answer_block("<answer>" * 1_000_000) is None
    assert answer_block("<answer>" * 1_000_000 + "7</answer>") == "<answer>" * 999_999 + "7"


@pytest.mark.parametrize(
    ("dataset", "answer", "allowed"),
    [
        ("simple_integration", "x**2/2 + 3*sin(x) + C", True),
        ("countdown", "(25 + 75) * 3 - 8", True),
        ("countdown", "(3 + 3) * 4", True),
        ("simple_integration", "integrate(2*x, x) + C", False),  # sympy would do the work
        ("countdown", "__import__('os').getpid()", False),
        ("countdown", "x.__class__", False),
        ("puzzle24", "(1).real", False),
        ("puzzle24", "[1][0]", False),
        ("puzzle24", "eval(chr(49))", False),
        ("intermediate_integration", "2*x**(3/2)/3 + x^2 + C", True),
        ("puzzle24", "9**9**9**9", False),  # sympy would compute it, past any deadline
        ("puzzle24", "9^(9)^9", False),
        ("countdown", "2**100000", False),
        ("countdown", "2**(10**9)", False),
        ("word_sorting", "__import__('os') anything", True),  # not parsed by sympy
        # sympy's one-letter callables: N(pi, 3000000) asks for three million digits
        ("simple_integration", "N(pi, 3000000)", False),
        ("simple_integration", "S(2)*x + C", False),
        ("simple_integration", "E*x**2 + C", True),  # Euler's number is a value, not a call
        ("simple_integration", "(9**99)**99 + C", False),  # a power of a power
        ("simple_integration", "((x**2))**3 + C", False),
        ("simple_integration", "(x + 1)**2 + C", True),
        ("simple_integration", "x**100 + C", False),  # references: exponents up to 10
        ("polynomial_multiplication", "1234567890123*x", False),  # 13 digits
        ("polynomial_multiplication", "-27328*z**2", True),
        # countdown and puzzle24: arithmetic of numbers, no free values
        ("countdown", "(25 + 75) * x / x", False),
        ("countdown", "100 + E - E", False),
        ("countdown", "2**3", False),
        ("countdown", "7 // 2", False),
        ("countdown", "1.5 * 2", False),
        # a NaN or infinity where the reference has none
        ("complex_arithmetic", "nan", False),
        ("complex_arithmetic", "-NaN", False),
        ("complex_arithmetic", "nan+nanj", False),
        ("complex_arithmetic", "nani", False),
        ("complex_arithmetic", "1e999", False),
        ("complex_arithmetic", "1e9_99", False),
        ("complex_arithmetic", "9" * 400, False),
        ("complex_arithmetic", "3.0 + 4.0i", True),
        ("basic_arithmetic", "Infinity", False),
        ("word_sorting", "banana, infinite", True),  # words that hold the letters
        ("word_sorting", "1e10", True),
    ],
)
def test_screen(dataset: str, answer: str, allowed: bool) -> None:
    assert (screen(dataset, answer) is None) is allowed


def test_a_nan_the_reference_holds_is_no_reason_to_refuse() -> None:
    entry = {"question": "q", "answer": "nan", "metadata": {}}
    assert screen("basic_arithmetic", "nan", entry) is None
    assert screen("basic_arithmetic", "inf", entry) is not None


def test_puzzle24_answers_must_use_the_rows_numbers() -> None:
    entry = {"question": "q", "answer": "1*3*5 + 9", "metadata": {"numbers": [1, 3, 5, 9]}}
    assert screen("puzzle24", "9 + 5*3*1", entry) is None
    why = screen("puzzle24", "1*2*3*4", entry)  # 24 on every row: its scorer does not check
    assert why is not None and "[1, 2, 3, 4]" in why
    assert screen("puzzle24", "1*3*5 + 9 + 0", entry) is not None


# -- the served environment -----------------------------------------------------------------


# The tests below share one served environment (and its warmed worker pool): starting workers
# and importing reasoning-gym in them is the slow part of these tests.
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    timeout = aiohttp.ClientTimeout(total=60, connect=5)
    async with (
        serve_server("reasoning_gym", name="rg") as (url, _),
        aiohttp.ClientSession(timeout=timeout) as http,
    ):
        yield url, http


async def _verify(
    env: tuple[str, aiohttp.ClientSession], row: dict[str, Any], text: str
) -> tuple[int, dict[str, Any]]:
    url, http = env
    async with http.post(url + "/verify", json={**row, "response": reply(text)}) as resp:
        return resp.status, await resp.json()


@pytest.mark.asyncio(loop_scope="module")
async def test_reference_scores_with_per_dataset_metric(env: Any) -> None:
    row = _row("chain_sum")
    status, body = await _verify(env, row, f"Sum it up. <answer>{row['answer']}</answer>")
    assert status == 200
    assert body["reward"] == 1.0 and body["answer_found"] == 1
    assert body["chain_sum/reward"] == 1.0
    assert body["task_name"] == "chain_sum" and body["extracted_answer"] == row["answer"]


@pytest.mark.asyncio(loop_scope="module")
async def test_no_answer_tag_scores_zero_without_the_scorer(env: Any) -> None:
    row = _row("chain_sum")
    status, body = await _verify(env, row, f"The answer is {row['answer']}.")
    assert (status, body["reward"], body["answer_found"], body["reason"]) == (
        200, 0.0, 0, "no_answer",
    )  # fmt: skip


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("nothing", ["", "   ", "\n", "[]", "{}", "[[]]", "''"])
@pytest.mark.parametrize("dataset", ["arc_agi", "knight_swap", "word_sorting"])
async def test_an_answer_that_says_nothing_scores_zero_without_the_scorer(
    env: Any, dataset: str, nothing: str
) -> None:
    # arc_agi's own scorer pays 0.05 for any board that parses, the empty one too (and 0 for a
    # wrong word); knight_swap's pays 0.05 for an empty move list: paid for nothing.
    row = _row(dataset)
    status, body = await _verify(env, row, f"<answer>{nothing}</answer>")
    assert (status, body["reward"], body["answer_found"], body["reason"]) == (
        200, 0.0, 0, "empty_answer",
    )  # fmt: skip
    assert body[f"{dataset}/reward"] == 0.0


def test_an_empty_answer_is_the_scorers_when_the_reference_is_empty() -> None:
    # ab's program may print nothing, codeio's output may be {}: then nothing is the answer.
    assert says_nothing("", "A# #A") and says_nothing("[]", None) and says_nothing(" ", "0")
    assert not says_nothing("", "") and not says_nothing("{}", "{}")
    assert not says_nothing("0", "1") and not says_nothing("[0]", "[]")


@pytest.mark.asyncio(loop_scope="module")
async def test_an_empty_reference_still_takes_an_empty_answer(env: Any) -> None:
    # An A::B program may reduce to nothing ("A# #A"); ab's scorer compares the answer with
    # the entry's, so an entry of empty output scores the empty answer 1.0.
    row = {**_row("ab"), "answer": ""}
    status, body = await _verify(env, row, "<answer></answer>")
    assert (status, body["reward"], body["answer_found"]) == (200, 1.0, 1), body


@pytest.mark.asyncio(loop_scope="module")
async def test_a_nemo_gym_row_is_scored_by_its_source_dataset(env: Any) -> None:
    row = _row("leg_counting")
    nemo = {k: row[k] for k in ("responses_create_params", "question", "answer", "metadata")}
    status, body = await _verify(env, nemo, f"<answer>{row['answer']}</answer>")
    assert (status, body["reward"]) == (200, 1.0)


@pytest.mark.asyncio(loop_scope="module")
async def test_config_overrides_reach_the_scorer(env: Any) -> None:
    row = _row("chain_sum", min_terms=5, max_terms=5)
    assert row["reasoning_gym"]["config"] == {"min_terms": 5, "max_terms": 5}
    assert row["question"].count("+") + row["question"].count("-") >= 4
    status, body = await _verify(env, row, f"<answer>{row['answer']}</answer>")
    assert (status, body["reward"]) == (200, 1.0)


@pytest.mark.asyncio(loop_scope="module")
async def test_an_eval_scorer_runs_no_code_from_the_answer(env: Any, tmp_path: Path) -> None:
    """string_insertion's scorer evals the answer: guarded, it reads a literal only."""
    row = _row("string_insertion")
    marker = tmp_path / "ran"
    attacks = [
        f"__import__('pathlib').Path({str(marker)!r}).write_text('x')",
        "list(oracle_answer)",  # the scorer's own local, the reference: 0.1 if eval ran
        "setattr(type(self), 'score_answer', lambda *a, **k: 1.0)",
    ]
    for attack in attacks:
        status, body = await _verify(env, row, f"<answer>{attack}</answer>")
        assert (status, body["reward"]) == (200, 0.0), body
    assert not marker.exists()
    # the scorer was not patched: a wrong answer still scores 0, the literal form 0.1
    status, body = await _verify(env, row, "<answer>wrong</answer>")
    assert body["reward"] == 0.0
    status, body = await _verify(env, row, f"<answer>{list(row['answer'])!r}</answer>")
    assert body["reward"] == 0.1


@pytest.mark.asyncio(loop_scope="module")
async def test_a_sympy_scorer_never_sees_code(env: Any, tmp_path: Path) -> None:
    row = _row("simple_integration")
    marker = tmp_path / "ran"
    for attack in [
        f"__import__('pathlib').Path({str(marker)!r}).write_text('x')",
        f"integrate({row['metadata']['integrand']}, {row['metadata']['variable']}) + C",
    ]:
        status, body = await _verify(env, row, f"<answer>{attack}</answer>")
        assert (status, body["reward"], body["reason"]) == (200, 0.0, "answer_refused")
    assert not marker.exists()


@pytest.mark.asyncio(loop_scope="module")
async def test_an_answer_the_scorer_raises_on_scores_zero(env: Any) -> None:
    # Not masked: a policy would learn that an answer the scorer chokes on costs nothing.
    row = _row("prime_factorization")
    status, body = await _verify(env, row, "<answer>two times three</answer>")
    assert status == 200
    assert (body["reward"], body["reason"]) == (0.0, "scorer_raised")
    assert "mask_sample" not in body
    assert "ValueError" in body["scorer_error"]
    assert body["prime_factorization/reward"] == 0.0


@pytest.mark.asyncio(loop_scope="module")
async def test_exploits_found_in_review_score_zero(env: Any) -> None:
    cases = [
        ("complex_arithmetic", "nan"),  # min(1.0, exp(-nan)) is 1.0
        ("puzzle24", "1*2*3*4"),  # 24, but not the row's numbers
        ("countdown", "x/x"),
    ]
    for dataset, answer in cases:
        status, body = await _verify(env, _row(dataset), f"<answer>{answer}</answer>")
        assert (status, body["reward"], body["reason"]) == (200, 0.0, "answer_refused"), body
        assert body["refusal"]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_nemo_gym_shaped_row_that_needs_its_types_restored_is_refused(env: Any) -> None:
    row = _row("arc_agi")
    assert row["reasoning_gym"].get("restore")  # its boards are tuples
    bare = {k: v for k, v in row.items() if k != "reasoning_gym"}
    status, body = await _verify(env, bare, f"<answer>{row['answer']}</answer>")
    assert status == 422, body
    assert "NeMo Gym-shaped" in body["error"]["message"]
    # A dataset whose entries are plain JSON scores as before without the field.
    plain = _row("word_sorting")
    bare = {k: v for k, v in plain.items() if k != "reasoning_gym"}
    status, body = await _verify(env, bare, f"<answer>{plain['answer']}</answer>")
    assert (status, body["reward"]) == (200, 1.0)
    assert "config_assumed" not in body


@pytest.mark.asyncio(loop_scope="module")
async def test_a_nemo_gym_shaped_row_scored_by_a_config_reading_scorer_says_so(
    env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    row = _row("time_intervals")
    bare = {k: v for k, v in row.items() if k != "reasoning_gym"}
    status, body = await _verify(env, bare, f"<answer>{row['answer']}</answer>")
    assert (status, body["reward"], body["config_assumed"]) == (200, 1.0, True)
    warned = [r for r in caplog.records if "time_intervals rows carry no config" in r.message]
    assert len(warned) == 1
    status, body = await _verify(env, bare, f"<answer>{row['answer']}</answer>")
    assert body["config_assumed"] is True  # warned once a dataset, said on every answer
    assert len([r for r in caplog.records if "carry no config" in r.message]) == 1
    status, body = await _verify(env, row, f"<answer>{row['answer']}</answer>")
    assert "config_assumed" not in body  # rollgym's rows carry their config


@pytest.mark.asyncio(loop_scope="module")
async def test_a_row_whose_reference_breaks_the_scorer_is_a_scorer_error(env: Any) -> None:
    row = {**_row("prime_factorization"), "answer": "not a factorization"}
    status, body = await _verify(env, row, "<answer>two times three</answer>")
    assert status == 500
    assert body["error"]["type"] == "scorer_error" and body["error"]["server"] == "rg"
    assert "reference" in body["error"]["message"]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_huge_answer_is_refused_before_the_scorer(env: Any) -> None:
    row = _row("word_sorting")
    huge = "<answer>" + row["answer"] * (10_000_000 // max(1, len(row["answer"]))) + "</answer>"
    status, body = await _verify(env, row, huge)
    assert (status, body["reward"], body["reason"]) == (200, 0.0, "answer_too_long")
    assert len(body["extracted_answer"]) == 200
    status, body = await _verify(env, row, "<answer>" * 1_000_000)
    assert (status, body["reason"]) == (200, "no_answer")
    status, body = await _verify(env, row, f"<answer>{row['answer']}</answer>")
    assert body["reward"] == 1.0  # and the server goes on scoring


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reasoning_gym": {"dataset": "chain_sun"}}, "did you mean 'chain_sum'"),
        ({"reasoning_gym": {"dataset": "game_of_life_halting"}}, "every non-empty answer"),
        ({"reasoning_gym": {"dataset": "chain_sum", "restore": [[["nope"], "tuple"]]}}, "nope"),
        ({"reasoning_gym": {"dataset": "chain_sum", "config": []}}, "config"),
        ({"reasoning_gym": {"dataset": "chain_sum", "config": {"min_term": 2}}}, "'min_terms'"),
        (
            {"reasoning_gym": {"dataset": "chain_sum", "config": {"min_terms": 9, "max_terms": 1}}},
            "refuses config",
        ),
        ({"reasoning_gym": "chain_sum"}, "metadata"),
        ({"metadata": None}, "metadata"),
        ({"reasoning_gym": {}, "metadata": {}}, "names no dataset"),
    ],
)
@pytest.mark.asyncio(loop_scope="module")
async def test_a_bad_row_is_a_422_naming_the_problem(
    env: Any, change: dict[str, Any], message: str
) -> None:
    row = {**_row("chain_sum"), **change}
    status, body = await _verify(env, row, "<answer>1</answer>")
    assert status == 422, body
    assert message in body["error"]["message"]


class MisbehavingEnv(ReasoningGymEnv):
    scorer = staticmethod(misbehaving_score)
    cpu_verify_workers = 1  # each test spawns pools again: one worker each is enough


@pytest.fixture
async def misbehaving() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    timeout = aiohttp.ClientTimeout(total=60, connect=5)
    async with (
        serve_server(MisbehavingEnv, name="rg", options={"verify_timeout": 5}) as (url, _),
        aiohttp.ClientSession(timeout=timeout) as http,
    ):
        yield url, http


async def test_a_slow_scorer_is_a_deadline_failure_never_a_zero(misbehaving: Any) -> None:
    row = _row("chain_sum")
    status, body = await _verify(misbehaving, row, f"<answer>{HANG}</answer>")
    assert status == 504 and body["error"]["type"] == "deadline_exceeded"
    status, body = await _verify(misbehaving, row, f"<answer>{row['answer']}</answer>")
    assert (status, body["reward"]) == (200, 1.0)  # on a fresh pool


async def test_a_scorer_that_kills_its_worker_alone_is_a_scorer_error(misbehaving: Any) -> None:
    row = _row("chain_sum")
    status, body = await _verify(misbehaving, row, f"<answer>{DIE}</answer>")
    assert status == 500 and body["error"]["type"] == "scorer_error"
    status, body = await _verify(misbehaving, row, f"<answer>{row['answer']}</answer>")
    assert (status, body["reward"]) == (200, 1.0)


async def test_nemo_gym_extraction_falls_back_as_nemo_gym_does() -> None:
    row = _row("chain_sum")
    timeout = aiohttp.ClientTimeout(total=60, connect=5)
    options = {"extraction": "nemo_gym"}
    async with (
        serve_server("reasoning_gym", name="rg", options=options) as (url, _),
        aiohttp.ClientSession(timeout=timeout) as http,
    ):
        env = (url, http)
        status, body = await _verify(env, row, f"So: \\boxed{{{row['answer']}}}")
        assert (status, body["reward"]) == (200, 1.0)
        status, body = await _verify(env, row, f" {row['answer']} ")
        assert (status, body["reward"]) == (200, 1.0)  # the whole reply
        status, body = await _verify(env, row, f"<answer>{row['answer']}x</answer> \\boxed{{1}}")
        assert body["reward"] < 1.0  # a block, when there is one, is the answer


def _sympy_rows() -> list[dict[str, Any]]:
    names = ("simple_integration", "intermediate_integration", "polynomial_multiplication")
    return [row for name in names for row in make_rows([DatasetChoice(name)], 20, seed=3)]


def _variable(row: dict[str, Any]) -> str:
    names = set(re.findall(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])", str(row["answer"]))) - {"C"}
    return str(row["metadata"].get("variable") or sorted(names)[0])


def _hostile(v: str) -> dict[str, str]:
    """Short answers past the old checks that held a scorer past any deadline (review)."""
    return {
        "new names": f"({v}+a+b+c+d+e+f)**99 + C",
        "a product of powers": "*".join(f"({v}+{i})**99" for i in range(1, 40)) + " + C",
        "nested calls": "sin(" * 100 + v + ")" * 100 + " + C",
        "nested exp": "exp(" * 30 + v + ")" * 30 + " + C",
        "many powers": "+".join(f"({v}+{i})**(99/97)" for i in range(1, 200)) + " + C",
        "a large exponent": f"{v}**99 + C",
    }


def test_a_sympy_answer_out_of_proportion_to_its_reference_is_refused() -> None:
    for row in _sympy_rows():
        entry = {k: row[k] for k in ("question", "answer", "metadata")}
        reference, name = str(row["answer"]), row["metadata"]["source_dataset"]
        assert screen(name, reference, entry) is None, reference
        # another form of the reference: its terms in the other order
        terms = reference.replace(" - ", " + -").split(" + ")
        assert screen(name, " + ".join(reversed(terms)), entry) is None, reference
        for what, answer in _hostile(_variable(row)).items():
            assert screen(name, answer, entry) is not None, (what, reference)


@pytest.mark.asyncio(loop_scope="module")
async def test_an_answer_that_would_hold_sympy_scores_0_at_once(env: Any) -> None:
    """Served: each scores 0 with the guard's reason, not a deadline failure."""
    row = _row("simple_integration")
    for what, answer in _hostile(_variable(row)).items():
        status, body = await _verify(env, row, f"<answer>{answer}</answer>")
        assert (status, body["reward"]) == (200, 0.0), (what, body)
        assert body.get("reason") not in (None, "no_answer"), body
    status, body = await _verify(env, row, f"<answer>{row['answer']}</answer>")
    assert (status, body["reward"]) == (200, 1.0)


REPO = Path(__file__).resolve().parents[2]
STATES_THE_COUNT = ("README.md", "docs/guides/reasoning-gym.md", "docs/guides/catalogues.md")


@pytest.mark.parametrize("page", STATES_THE_COUNT)
def test_the_docs_state_the_number_of_datasets_the_code_offers(page: str) -> None:
    # One count, the code's (registered minus composite and the broken scorers): a page that
    # says 106 or 105 beside 103 leaves a reader to guess which one --list will print.
    from rollgym.envs.reasoning_gym.tasks import offered

    text = " ".join((REPO / page).read_text().split())  # a count may wrap onto the next line
    stated = re.findall(r"\b(\d+) (?:of its )?datasets\b", text)
    assert stated, f"{page} no longer states how many datasets are offered"
    assert set(stated) == {str(len(offered()))}, f"{page}: {stated}"
