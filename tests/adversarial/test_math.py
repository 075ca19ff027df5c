"""Red team: math answers a policy under training may try, against a real server.

- Answers that game the parser (several boxes, candidate lists, sets and intervals that contain
  the answer, ``x = 3 or x = 4``): math-verify reads one answer and compares it whole, so none
  scores for two different golds and none that lists candidates scores at all. Pinned here
  (they held before this suite too).
- Answers that make sympy work for ever: math-verify's own 5 s limits stop most of them (score
  0); work no signal can interrupt is stopped at ``verify_timeout`` and scores 0 with reason
  ``check_timeout`` (before: ``deadline_exceeded``, a failed rollout a policy could learn to
  produce for free), and an answer that kills its worker twice scores 0 with ``check_crashed``
  (before: a 500).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from rollgym.envs.math.check import MathCheck, check_answer
from rollgym.envs.math.server import MathEnv
from rollgym.testing import serve_server
from tests.envs.env_client import EnvClient
from tests.envs.hanging import HANG, hanging_check

pytestmark = pytest.mark.timeout(180)

CRASH = "this answer kills the worker that checks it"


def crashing_check(expected: str, answer: str, problem: str = "") -> MathCheck:
    """``hanging_check``, and a worker that dies (as out of memory would) on ``CRASH``."""
    if answer == CRASH:
        os._exit(1)
    return hanging_check(expected, answer, problem)


class HostileMathEnv(MathEnv):
    checker = staticmethod(crashing_check)


def _task(expected: str) -> dict[str, Any]:
    return {"responses_create_params": {"input": "Solve it."}, "expected_answer": expected}


def _http() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60, connect=5))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def math_env() -> AsyncIterator[EnvClient]:
    async with serve_server(MathEnv, name="math") as (url, _), _http() as http:
        yield EnvClient(http, url)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile_env() -> AsyncIterator[EnvClient]:
    # Short enough to stop the 60 s hang well inside the test's timeout, long enough for a
    # fresh pool's worker to import math-verify on a busy machine (it counts in the check).
    options = {"verify_timeout": 12.0}
    async with (
        serve_server(HostileMathEnv, name="math", options=options) as (url, _),
        _http() as http,
    ):
        yield EnvClient(http, url)


SHOTGUNS = [
    "\\boxed{3}\\boxed{4}",
    "\\boxed{4} \\boxed{3}",
    "\\boxed{3} or \\boxed{4}",
    "\\boxed{3, 4}",
    "\\boxed{\\{3, 4\\}}",
    "\\boxed{[3, 4]}",
    "\\boxed{3 \\text{ or } 4}",
    "\\boxed{x = 3 \\text{ or } x = 4}",
    "x = 3 or x = 4",
    "3 or 4",
    "\\boxed{3 \\lor 4}",
    "\\boxed{3 \\pm 1}",
    "\\boxed{x = 4 = 3}",
    "\\boxed{\\sqrt{9} = \\sqrt{16}}",
    "\\boxed{3 \\\\ 4}",
]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("answer", SHOTGUNS)
async def test_no_answer_scores_for_two_golds(math_env: EnvClient, answer: str) -> None:
    rewards = []
    for gold in ("3", "4"):
        status, body = await math_env.verify(_task(gold), answer)
        assert status == 200, body
        rewards.append(body["reward"])
    assert sum(rewards) <= 1.0, rewards


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "answer",
    [
        ", ".join(str(i) for i in range(1, 101)),
        "\\boxed{" + ", ".join(str(i) for i in range(1, 101)) + "}",
        "\\boxed{1, 2, 3, \\ldots, 100}",
        "\\boxed{\\{1, 2, \\ldots, 100\\}}",
        "\\boxed{[1, 100]}",
        "\\boxed{(0, \\infty)}",
        "\\boxed{\\mathbb{R}}",
        "\\boxed{x \\in \\mathbb{R}}",
        "\\boxed{x}",
    ],
)
async def test_answers_that_contain_the_gold_score_0(math_env: EnvClient, answer: str) -> None:
    status, body = await math_env.verify(_task("50"), answer)
    assert status == 200 and body["reward"] == 0.0, body


@pytest.mark.asyncio(loop_scope="module")
async def test_answers_that_make_sympy_work_for_ever_score_0(math_env: EnvClient) -> None:
    answers = [
        "\\boxed{10^{10^{10}}}",
        "\\boxed{9^{9^{9^{9}}}}",
        "9**9**9**9",
        "\\boxed{100000000!}",
        "\\boxed{10^{10^{10}} - 10^{10^{10}} + 3}",
        "\\boxed{" + "(" * 3000 + "3" + ")" * 3000 + "}",
        "\\boxed{" + "9" * 100_000 + "}",
        "\\boxed{" + "{" * 5000 + "3" + "}" * 5000 + "}",
        "\\boxed{NaN}",
    ]
    results = await asyncio.gather(*(math_env.verify(_task("3"), a) for a in answers))
    for answer, (status, body) in zip(answers, results, strict=True):
        assert status == 200 and body["reward"] == 0.0, (answer[:40], body)
    status, body = await math_env.verify(_task("3"), "\\boxed{3}")
    assert status == 200 and body["reward"] == 1.0


@pytest.mark.asyncio(loop_scope="module")
async def test_work_no_signal_stops_scores_0_at_the_deadline(hostile_env: EnvClient) -> None:
    status, body = await hostile_env.verify(_task("3"), HANG)
    assert status == 200, body
    assert (body["reward"], body["reason"]) == (0.0, "check_timeout")
    status, body = await hostile_env.verify(_task("3"), "\\boxed{3}")
    assert status == 200 and body["reward"] == 1.0


@pytest.mark.asyncio(loop_scope="module")
async def test_an_answer_that_kills_its_worker_twice_scores_0(hostile_env: EnvClient) -> None:
    status, body = await hostile_env.verify(_task("3"), CRASH)
    assert status == 200, body
    assert (body["reward"], body["reason"]) == (0.0, "check_crashed")
    status, body = await hostile_env.verify(_task("3"), "\\boxed{3}")
    assert status == 200 and body["reward"] == 1.0
    assert check_answer("3", "\\boxed{3}").correct  # the checker itself is the real one
