"""MathEnv: symbolic equivalence with math-verify, run in a process pool under a deadline."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from rollgym.envs.math.check import MathCheck, check_answer, gold_text
from rollgym.envs.math.server import MathEnv
from rollgym.errors import DeadlineExceeded, WaitedTooLong
from rollgym.server.resources import Session
from rollgym.testing import serve_server

from .env_client import EnvClient, reply
from .hanging import HANG, hanging_check

pytestmark = pytest.mark.timeout(60)


def _task(expected: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "Compute."}, "expected_answer": expected}


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    # math-verify arms SIGALRM for its own timeouts; in a worker it cannot disturb this
    # process's alarm (pytest-timeout's), and the check runs as it does in MathEnv.
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


def check(pool: ProcessPoolExecutor, expected: str, answer: str, problem: str = "") -> MathCheck:
    result: MathCheck = pool.submit(check_answer, expected, answer, problem).result(timeout=30)
    return result


@pytest.mark.parametrize(
    ("expected", "answer"),
    [
        ("\\frac{1}{2}", "\\boxed{1/2}"),
        ("\\frac{1}{2}", "\\boxed{0.5}"),
        ("\\frac{1}{2}", "The answer is $\\frac{1}{2}$."),
        ("1/2", "\\boxed{\\frac{2}{4}}"),
        ("0.5", "So it is 1/2."),
        ("6\\sqrt{2}", "\\boxed{\\sqrt{72}}"),
        ("9\\pi", "\\boxed{28.274334}"),
        ("x^2+6x+9", "\\boxed{(x+3)^2}"),
        ("x+1", "$1 + x$"),
        ("2, 3", "\\boxed{3, 2}"),
        ("(-2, 2)", "\\boxed{(-2,2)}"),
        ("1024", "\\boxed{1,024}"),
        ("6", "Solving gives $x = 6$."),
        ("$\\frac{3}{4}$", "\\boxed{0.75}"),  # a gold that is already in math mode
        ("12", "First I got 10, but the answer is \\boxed{12}."),
    ],
)
def test_equivalent_answers_are_correct(
    pool: ProcessPoolExecutor, expected: str, answer: str
) -> None:
    assert check(pool, expected, answer) == MathCheck(True, True, True)


@pytest.mark.parametrize(
    ("expected", "answer", "parsed"),
    [
        ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}", True),
        ("\\frac{1}{2}", "\\boxed{0.49}", True),
        ("6\\sqrt{2}", "\\boxed{8\\sqrt{2}}", True),
        ("x^2+6x+9", "\\boxed{x^2+9}", True),
        ("(-2, 2)", "\\boxed{[-2, 2]}", True),  # closed is not open
        ("-3", "\\boxed{3}", True),
        ("12", "\\boxed{13}", True),
        ("\\frac{1}{2}", "I need more time.", False),
        ("\\frac{1}{2}", "", False),
    ],
)
def test_different_answers_are_wrong(
    pool: ProcessPoolExecutor, expected: str, answer: str, parsed: bool
) -> None:
    assert check(pool, expected, answer) == MathCheck(True, parsed, False)


COMPUTE = "Compute $\\frac{3}{4} + \\frac{1}{8}$. Put your final answer in \\boxed{}."


@pytest.mark.parametrize(
    ("expected", "problem", "answer"),
    [
        # math-verify evaluates the problem's own expression to the gold: restating it is no
        # solution, whether the prompt comes back whole or its expression is boxed.
        ("\\frac{7}{8}", COMPUTE, COMPUTE),
        ("\\frac{7}{8}", COMPUTE, "\\boxed{\\frac{3}{4} + \\frac{1}{8}}"),
        ("\\frac{7}{8}", COMPUTE, "\\boxed{\\frac{1}{8}+\\frac{3}{4}}"),  # terms in another order
        ("\\frac{7}{8}", COMPUTE, "\\boxed{3/4 + 1/8}"),  # fractions written otherwise
        ("\\frac{7}{8}", COMPUTE, "3/4 + 1/8"),
        ("\\frac{7}{8}", COMPUTE, "The answer is $\\frac{3}{4} + \\frac{1}{8}$."),
        ("\\frac{7}{8}", COMPUTE, "\\boxed{x = \\frac{3}{4} + \\frac{1}{8}}"),
        ("6\\sqrt{2}", "Simplify $\\sqrt{72}$.", "\\boxed{\\sqrt{72}}"),
        ("x^2+6x+9", "Expand $(x+3)^2$.", "\\boxed{(x+3)^2}"),
        ("1024", "What is $2^{10}$?", "\\boxed{2^{10}}"),
        ("42", "Compute $7!/5!$.", "\\boxed{7!/5!}"),
        ("1", "Evaluate $\\int_0^1 2x \\, dx$.", "Evaluate $\\int_0^1 2x \\, dx$."),
        ("x+1", "Simplify $\\frac{x^2-1}{x-1}$.", "\\boxed{\\frac{x^2-1}{x-1}}"),
        ("\\frac{3}{4}", "Write $0.75$ as a fraction.", "\\boxed{0.75}"),
        # Without math mode in the problem.
        ("1024", "What is 2^10?", "\\boxed{2^{10}}"),
        ("42", "Compute 7!/5!.", "\\boxed{7!/5!}"),
        ("\\frac{7}{8}", "Compute 3/4 + 1/8.", "\\boxed{\\frac{3}{4} + \\frac{1}{8}}"),
        ("x^2+6x+9", "Expand (x+3)^2, please.", "$(x+3)^2$"),
    ],
)
def test_an_answer_that_restates_the_problem_earns_nothing(
    pool: ProcessPoolExecutor, expected: str, problem: str, answer: str
) -> None:
    assert check(pool, expected, answer, problem) == MathCheck(True, True, False, True)


@pytest.mark.parametrize(
    ("expected", "problem", "answer"),
    [
        ("\\frac{7}{8}", COMPUTE, "\\boxed{\\frac{7}{8}}"),
        ("\\frac{7}{8}", COMPUTE, "7/8"),
        ("\\frac{7}{8}", COMPUTE, "\\boxed{0.875}"),
        ("\\frac{7}{8}", COMPUTE, "\\boxed{\\frac{14}{16}}"),
        ("\\frac{7}{8}", COMPUTE, "\\boxed{0.75 + 0.125}"),  # part of the work done
        # Working that quotes the problem's expression on the way to the answer.
        (
            "\\frac{7}{8}",
            COMPUTE,
            "We have $\\frac{3}{4} + \\frac{1}{8} = \\frac{6}{8} + \\frac{1}{8}$, so \\boxed{\\frac{7}{8}}.",
        ),
        ("\\frac{7}{8}", COMPUTE, "$\\frac{3}{4} + \\frac{1}{8} = \\frac{7}{8}$"),
        # The problem names the answer, in the gold's form: that is the answer, not a restatement.
        ("12", "What is the gcd of $12$ and $24$?", "\\boxed{12}"),
        ("12", "What is the gcd of 12 and 24?", "12"),
        ("\\frac{1}{2}", "Which is larger, $\\frac{1}{2}$ or $\\frac{1}{3}$?", "1/2"),
        ("5", "Let $a = 5$. What is $a$?", "$a = 5$"),
        # A number the problem says in passing is no restatement (a review found these at 0).
        ("x=2", "Solve for $x$: $3x + 1 = 7$. Check your answer in 2 steps.", "\\boxed{2}"),
        ("x=2", "If $3x+1=7$, find $x$. (Problem 2)", "\\boxed{2}"),
        ("5.0", "Each has 1 apple. There are 5 shops. How many shops?", "\\boxed{5}"),
        ("6", "Solve $2x + 5 = 17$ for $x$.", "\\boxed{x = 6}"),
        ("6\\sqrt{2}", "Simplify $\\sqrt{72}$.", "\\boxed{\\sqrt{2} \\cdot 6}"),
        ("6\\sqrt{2}", "What is the diagonal of a square of side 6?", "\\boxed{\\sqrt{72}}"),
        ("1024", "What is 2^10? A well-known power.", "\\boxed{1024}"),
    ],
)
def test_a_correct_answer_keeps_its_reward_beside_the_problem(
    pool: ProcessPoolExecutor, expected: str, problem: str, answer: str
) -> None:
    assert check(pool, expected, answer, problem) == MathCheck(True, True, True)


def test_gold_text_boxes_the_answer_as_nemo_gym_does() -> None:
    # Outer \( \) and then $ $ are stripped, and the rest is always boxed.
    assert gold_text(" \\sqrt{18} ") == "\\boxed{\\sqrt{18}}"
    assert gold_text("$x$") == "\\boxed{x}"
    assert gold_text("\\(\\frac{1}{2}\\)") == "\\boxed{\\frac{1}{2}}"
    assert gold_text("\\( $3$ \\)") == "\\boxed{3}"
    assert gold_text("$") == "\\boxed{$}"
    assert gold_text("\\boxed{4}") == "\\boxed{\\boxed{4}}"


# The env tests below share one MathEnv (and its warmed worker pool): starting workers and
# importing math-verify in them is the slow part of these tests.
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def math_env() -> AsyncIterator[EnvClient]:
    async with serve_server(MathEnv, name="math") as (url, _), _http() as http:
        yield EnvClient(http, url)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hanging_env() -> AsyncIterator[tuple[EnvClient, MathEnv]]:
    # Short enough to stop the 60 s hang well inside the test's timeout, long enough for a
    # fresh pool's worker to import math-verify on a busy machine (it counts in the check).
    options = {"verify_timeout": 12.0}
    async with (
        serve_server(HangingMathEnv, name="math", options=options) as (url, server),
        _http() as http,
    ):
        assert isinstance(server, MathEnv)
        yield EnvClient(http, url), server


def _http() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30, connect=5))


@pytest.mark.asyncio(loop_scope="module")
async def test_verify_scores_equivalent_forms_the_same(math_env: EnvClient) -> None:
    task = _task("\\frac{1}{2}")
    cases = [
        ("\\boxed{1/2}", 1.0, 1),
        ("\\boxed{0.5}", 1.0, 1),
        ("The answer is $\\frac{1}{2}$.", 1.0, 1),
        ("\\boxed{\\frac{1}{3}}", 0.0, 1),
        ("No idea.", 0.0, 0),
    ]
    sessions = await asyncio.gather(*(math_env.seed(task) for _ in cases))
    results = await asyncio.gather(
        *(math_env.verify(task, c[0], sid) for c, sid in zip(cases, sessions, strict=True))
    )
    for (text, reward, parsed), (status, verified) in zip(cases, results, strict=True):
        assert status == 200, verified
        assert (verified["reward"], verified["answer_parsed"]) == (reward, parsed), text


@pytest.mark.asyncio(loop_scope="module")
async def test_verify_pays_nothing_for_the_problem_given_back(math_env: EnvClient) -> None:
    # The problem is every message of the prompt, and NeMo Gym's question field.
    task = {
        "responses_create_params": {"input": [
            {"role": "system", "content": "Put your final answer in \\boxed{}."},
            {"role": "user", "content": [{"type": "input_text", "text": COMPUTE}]},
        ]},
        "expected_answer": "\\frac{7}{8}",
    }  # fmt: skip
    nemo = {**_task("\\frac{7}{8}"), "question": "Compute $\\frac{3}{4} + \\frac{1}{8}$."}
    cases = [
        (task, COMPUTE, 0.0),
        (task, "\\boxed{\\frac{3}{4} + \\frac{1}{8}}", 0.0),
        (nemo, "\\boxed{\\frac{3}{4} + \\frac{1}{8}}", 0.0),
        (task, "So $\\frac{3}{4} + \\frac{1}{8} = \\frac{7}{8}$: \\boxed{\\frac{7}{8}}", 1.0),
        (nemo, "\\boxed{0.875}", 1.0),
    ]
    for row, text, reward in cases:
        status, verified = await math_env.verify(row, text)
        assert status == 200, verified
        reason = None if reward else "restates_problem"
        got = (verified["reward"], verified["answer_parsed"], verified.get("reason"))
        assert got == (reward, 1, reason), text


@pytest.mark.asyncio(loop_scope="module")
async def test_verify_accepts_a_numeric_expected_answer(math_env: EnvClient) -> None:
    status, verified = await math_env.verify(_task(42), "\\boxed{42}")
    assert status == 200 and verified["reward"] == 1.0


@pytest.mark.asyncio(loop_scope="module")
async def test_verify_rejects_an_unusable_expected_answer(math_env: EnvClient) -> None:
    for expected in [None, "", "   ", "}", "\\boxed{}", "$$"]:
        status, body = await math_env.verify(_task(expected), "\\boxed{1}")
        assert status == 422, expected
        assert "expected_answer" in body["error"]["message"]


class HangingMathEnv(MathEnv):
    checker = staticmethod(hanging_check)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_check_that_hangs_scores_0_at_the_deadline(
    hanging_env: tuple[EnvClient, MathEnv],
) -> None:
    # The answer made the check hang: that is the answer's fault, scored 0 (as NeMo Gym does),
    # never a failed rollout a policy could learn to produce for free.
    env, server = hanging_env
    # Stopped at the deadline (its reason says so), not after the 60 s sleep: the test's
    # timeout bounds the wait, no wall-clock assertion a busy machine could break.
    verified = await server.verify(Session(id="s", task={}), _task("1/2"), reply(HANG))
    assert verified == {"reward": 0.0, "answer_parsed": 0, "reason": "check_timeout"}
    # The env goes on: the next check runs on a fresh pool.
    status, verified = await env.verify(_task("1/2"), "\\boxed{1/2}")
    assert status == 200 and verified["reward"] == 1.0


@pytest.mark.asyncio(loop_scope="module")
async def test_a_hung_check_scores_0_and_spares_its_neighbour(
    hanging_env: tuple[EnvClient, MathEnv],
) -> None:
    env, _ = hanging_env
    assert (await env.verify(_task("1/2"), "\\boxed{0.5}"))[0] == 200  # workers warm
    (status, body), (n_status, neighbour) = await asyncio.gather(
        env.verify(_task("1/2"), HANG), env.verify(_task("1/2"), "\\boxed{0.5}")
    )
    assert status == 200 and (body["reward"], body["reason"]) == (0.0, "check_timeout")
    assert n_status == 200 and neighbour["reward"] == 1.0


async def test_a_check_that_never_gets_a_worker_still_fails() -> None:
    # Waiting for a worker is the server's fault (overloaded), not the answer's: no score.
    async with serve_server(MathEnv, name="math") as (_, server):
        assert isinstance(server, MathEnv)

        async def run_cpu(fn: Any, *args: Any, timeout: float | None = None) -> Any:
            # What run_cpu raises for work that never left the queue (its type says so).
            raise WaitedTooLong("MathEnv: CPU work waited 30s for a free worker", server="math")

        server.run_cpu = run_cpu  # type: ignore[method-assign]
        with pytest.raises(DeadlineExceeded):
            await server.verify(Session(id="s", task={}), _task("1/2"), reply("\\boxed{0.5}"))


async def test_a_check_lost_to_a_broken_pool_runs_once_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A dead worker breaks the whole pool; the checks beside it are not at fault.
    async with serve_server(MathEnv, name="math") as (_, server):
        assert isinstance(server, MathEnv)
        calls: list[tuple[Any, ...]] = []
        outcomes: list[Any] = []

        async def run_cpu(fn: Any, *args: Any, timeout: float | None = None) -> Any:
            assert fn is check_answer and timeout == server.options.verify_timeout
            calls.append(args)
            outcome = outcomes.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

        monkeypatch.setattr(server, "run_cpu", run_cpu)
        outcomes[:] = [BrokenProcessPool("a worker was killed"), MathCheck(True, True, True)]
        assert await server._check("1/2", "\\boxed{0.5}", "Halve 1.") == MathCheck(True, True, True)
        assert calls == [("1/2", "\\boxed{0.5}", "Halve 1.")] * 2

        # A second break in a row is this answer's own doing: not tried a third time, scored 0.
        calls.clear()
        outcomes[:] = [BrokenProcessPool("killed"), BrokenProcessPool("killed again")]
        verified = await server.verify(Session(id="s", task={}), _task("1/2"), reply("x"))
        assert verified == {"reward": 0.0, "answer_parsed": 0, "reason": "check_crashed"}
        assert len(calls) == 2
