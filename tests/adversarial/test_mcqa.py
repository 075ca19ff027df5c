"""Red team: mcqa replies a policy under training may try, against a real server.

- Naming several options (``A B C D``, one letter per line, ``\\boxed{A}\\boxed{B}``, ``Answer: A``
  then ``Answer: B``): in rollgym's own ``rollgym_lenient`` mode such a reply is no answer, for
  whichever letter is right (before, the last letter listed was read as the answer).
- Replies that made a reader quadratic (unclosed boxes, nested ``\\text{}``): mcqa grades on the
  event loop, so one such reply stalled every rollout on the server for minutes.
- NeMo Gym's modes read one place of the reply (its first box, its first ``answer:``), as NeMo
  Gym does; no reply can score for two different letters there, so listing options pays no more
  than naming one. That invariant is pinned here (it held before this suite too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from rollgym.envs.mcqa.server import MCQAEnv
from rollgym.testing import serve_server
from tests.envs.env_client import EnvClient

pytestmark = pytest.mark.timeout(120)

OURS = {"A": "Mercury", "B": "Venus", "C": "Earth", "D": "Mars"}
NEMO = [{k: v} for k, v in OURS.items()]
NEMO_MODES = ["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]

HEDGES = [
    "A B C D",
    "A\nB\nC\nD",
    "A.\nB.\nC.\nD.",
    "(A)(B)(C)(D)",
    "A) B) C) D)",
    "the answer is A or B or C or D",
    "Answer: A, B, C, and D",
    "Final answer: A; B; C; D",
    "Answer: A | B",
    "Answer: A+B",
    "Answer: A and/or B",
    "the answer is\nA\nB\nC\nD",
    "Answer: A\nB",
    "\\boxed{ABCD}",
    "\\boxed{A B C D}",
    "\\boxed{(A) (B) (C) (D)}",
    "\\boxed{A}\\boxed{B}\\boxed{C}\\boxed{D}",
    "\\boxed{A} or \\boxed{B}",
    "\\boxed{A}, \\boxed{B}, \\boxed{C}, \\boxed{D}",
    "Answer: A\nAnswer: B\nAnswer: C\nAnswer: D",
    "\\boxed{Mercury Venus Earth Mars}",
    "Answer: Mercury, Venus, Earth or Mars",
    # Separators no list of them names: any symbol, LaTeX command or hedging word joins.
    "A\n\nB\n\nC\n\nD",
    "C" + "\n" * 40 + "D",
    "\\boxed{A}\\quad\\boxed{B}\\quad\\boxed{C}\\quad\\boxed{D}",
    "Answer: A \u00b7 B \u00b7 C \u00b7 D",
    "Answer: A \u2014 B \u2014 C \u2014 D",
    "Answer: A\n- B\n- C\n- D",
    "Answer: A? B? C? D?",
    "Answer: A\u200bB\u200bC\u200bD",
    "Answer: A (or B) (or C) (or D)",
    "Answer: A or maybe B or maybe C or maybe D",
    "Answer: A vs B vs C vs D",
    "Answer: A \u2228 B \u2228 C \u2228 D",
    "Answer: A~B~C~D",
    "Answer: A\\,B\\,C\\,D",
    "Answer: A, or B, or C, or D",
    "Answer: A. Or B. Or C. Or D.",
    "Answer: A... or B... or C... or D",
    "Answer: A, then B, then C, then D",
    "A\n.\nB\n.\nC\n.\nD",
    "A\n\u200b\nB\n\u200b\nC\n\u200b\nD",
    "Answer: A B C D\u200b",
]

# Replies that answer one option and mention others in their reasoning: still that option.
ANSWERS_B = [
    "Answer: B. A is wrong because it is closest to the Sun.",
    "Answer: B, not A",
    "Answer: B\n\n- A is Mercury, the first planet\n- C is Earth",
    "Answer: B.\n\nOption A is Mercury.",
    "I think the answer is B.\n\nExplanation: A is too hot, C is us, D is red.",
    "Answer: B (Venus)",
    "Answer: B \u2014 Venus is second",
    "Answer: A. Wait, actually the answer is B",
    # review: explanations that name other options in brackets, lists of reasons, markdown
    "The answer is B. (A) and (C) are wrong.",
    "Answer: B (A and C are incorrect)",
    "I'd go with B (A is close, but wrong).",
    "The answer is \\boxed{B}. A is incorrect since it is closest to the Sun.",
    "$\\boxed{B}$.\n\nA is wrong.",
    "Answer: B.\n\nA and C are wrong.",
    "Answer: B!\n\nA is wrong.",
    "Answer: B. Also, A is wrong.",
    "The correct answer is B \u2014 A is too hot.",
    "Answer: B.\n\n---\n\nA is wrong",
    "Answer: B\n\n> A is Mercury",
    "Answer: B\n\n### A is incorrect",
    "Answer: B\u3002A is wrong",
    "Answer: B\uff08A is wrong\uff09",
    "Initial answer: A\n\n---\n\nFinal answer: B",
    "Answer: A \u274c\nAnswer: B \u2705",
    "Answer: B\n" + "=" * 1200,
    "The planet is Venus.\n\nB",
]

STALLS = {
    "unclosed boxes": "\\boxed{" * 20_000,
    "nested wrappers": "\\text{" * 20_000 + "B" + "}" * 20_000,
    "nested textbf": "\\textbf{" * 10_000 + "B" + "}" * 10_000,
    # Found by review: a list of letters that does not end the text made one pattern
    # exponential (20 letters: 1 s, doubling with each one more), and a long run of spaces made others quadratic.
    "letters then a word": "Answer: A" + " B" * 5_000 + " xyz",
    "spaces after an answer": "Answer: B" + " " * 200_000 + ". Venus",
    "spaces after a paren": "A)" + " " * 200_000 + "x",
}


def _row(expected: str, *, nemo: bool = False, mode: str | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "responses_create_params": {"input": "Which planet is second from the Sun?"},
        "options": NEMO if nemo else OURS,
        "expected_answer": expected,
    }
    if mode is not None:
        row["grading_mode"] = mode
    return row


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def mcqa() -> AsyncIterator[EnvClient]:
    """One server and one client for the module, on the module's loop; every wait bounded."""
    timeout = aiohttp.ClientTimeout(total=30, connect=5)
    async with (
        serve_server(MCQAEnv, name="mcqa") as (url, _),
        aiohttp.ClientSession(timeout=timeout) as http,
    ):
        yield EnvClient(http, url)


async def _scores(env: EnvClient, text: str, **row: Any) -> list[float]:
    rewards = []
    for letter in OURS:
        status, body = await env.verify(_row(letter, **row), text)
        assert status == 200, body
        rewards.append(body["reward"])
    return rewards


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("text", HEDGES)
async def test_a_reply_naming_several_options_scores_0_for_every_letter(
    mcqa: EnvClient, text: str
) -> None:
    env = mcqa
    assert await _scores(env, text) == [0.0] * 4
    status, _ = await env.request("GET", "/health")
    assert status == 200


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("text", ANSWERS_B)
async def test_a_reply_that_explains_its_one_answer_still_scores_it(
    mcqa: EnvClient, text: str
) -> None:
    assert await _scores(mcqa, text) == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("mode", NEMO_MODES)
@pytest.mark.parametrize("text", HEDGES)
async def test_in_nemo_gyms_modes_no_reply_scores_for_two_letters(
    mcqa: EnvClient, text: str, mode: str
) -> None:
    assert sum(await _scores(mcqa, text, nemo=True, mode=mode)) <= 1.0


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("mode", [*NEMO_MODES, None])
@pytest.mark.parametrize("name", list(STALLS))
async def test_replies_that_made_a_reader_quadratic_are_graded_at_once(
    mcqa: EnvClient, name: str, mode: str | None
) -> None:
    # Before: minutes of regex work on the event loop (the client gives up after 30 s).
    env = mcqa
    status, body = await env.verify(_row("B", nemo=mode is not None, mode=mode), STALLS[name])
    assert status == 200, body
    assert body["reward"] in (0.0, 1.0)
    status, _ = await env.request("GET", "/health")
    assert status == 200


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "text",
    ["\x00\x01\x02 \\boxed{\x00}", "\u202e\\boxed{B}\u202c" * 1000, "x" * 5_000_000, "\ufffd" * 10],
)
async def test_odd_text_is_scored_not_a_failure(mcqa: EnvClient, text: str) -> None:
    # Already scored before this suite; kept so it stays so.
    for row in (_row("B"), _row("B", nemo=True)):
        status, body = await mcqa.verify(row, text)
        assert status == 200, body
        assert body["reward"] in (0.0, 1.0)
