"""MathEnv: symbolic equivalence with math-verify, run in a process pool under a deadline."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

from rollgym.envs.math.check import MathCheck, check_answer, gold_text
from rollgym.envs.math.server import MathEnv
from rollgym.errors import DeadlineExceeded
from rollgym.testing import serve_server

pytestmark = pytest.mark.timeout(60)


def _task(expected: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "Compute."}, "expected_answer": expected}


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    # math-verify arms SIGALRM for its own timeouts; in a worker it cannot disturb this
    # process's alarm (pytest-timeout's), and the check runs as it does in MathEnv.
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


def check(pool: ProcessPoolExecutor, expected: str, answer: str) -> MathCheck:
    result: MathCheck = pool.submit(check_answer, expected, answer).result(timeout=30)
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


def test_gold_text_boxes_bare_answers() -> None:
    assert gold_text(" \\sqrt{18} ") == "\\boxed{\\sqrt{18}}"
    assert gold_text("$x$") == "$x$"
    assert gold_text("\\boxed{4}") == "\\boxed{4}"


async def test_verify_scores_equivalent_forms_the_same(connect: Callable[..., Any]) -> None:
    task = _task("\\frac{1}{2}")
    cases = [
        ("\\boxed{1/2}", 1.0, 1),
        ("\\boxed{0.5}", 1.0, 1),
        ("The answer is $\\frac{1}{2}$.", 1.0, 1),
        ("\\boxed{\\frac{1}{3}}", 0.0, 1),
        ("No idea.", 0.0, 0),
    ]
    async with serve_server(MathEnv, name="math") as (url, _):
        env = connect(url)
        sessions = await asyncio.gather(*(env.seed(task) for _ in cases))
        results = await asyncio.gather(
            *(env.verify(task, c[0], sid) for c, sid in zip(cases, sessions, strict=True))
        )
    for (text, reward, parsed), (status, verified) in zip(cases, results, strict=True):
        assert status == 200, verified
        assert (verified["reward"], verified["answer_parsed"]) == (reward, parsed), text


async def test_verify_accepts_a_numeric_expected_answer(connect: Callable[..., Any]) -> None:
    async with serve_server(MathEnv, name="math") as (url, _):
        status, verified = await connect(url).verify(_task(42), "\\boxed{42}")
    assert status == 200 and verified["reward"] == 1.0


@pytest.mark.parametrize("expected", [None, "", "   ", "}", "\\boxed{}", "$$"])
async def test_verify_rejects_an_unusable_expected_answer(
    connect: Callable[..., Any], expected: Any
) -> None:
    async with serve_server(MathEnv, name="math") as (url, _):
        status, body = await connect(url).verify(_task(expected), "\\boxed{1}")
    assert status == 422
    assert "expected_answer" in body["error"]["message"]


def slow_check(expected: str, answer: str) -> MathCheck:
    """A check that never finishes in time (module level: it runs in a pool worker)."""
    time.sleep(60)
    return MathCheck(True, True, True)


class SlowMathEnv(MathEnv):
    checker = staticmethod(slow_check)


async def test_a_check_that_hangs_fails_with_deadline_exceeded(
    connect: Callable[..., Any],
) -> None:
    async with serve_server(SlowMathEnv, name="math", options={"verify_timeout": 1.5}) as (
        url,
        server,
    ):
        started = time.monotonic()
        status, body = await connect(url).verify(_task("1"), "\\boxed{1}")
        elapsed = time.monotonic() - started
        assert isinstance(server, MathEnv)
        with pytest.raises(DeadlineExceeded):
            await server._check("1", "\\boxed{1}")
    assert status == 504
    assert body["error"]["type"] == "deadline_exceeded"
    assert body["error"]["server"] == "math"
    assert elapsed < 10  # stopped at the deadline, not after the 60 s sleep


async def test_the_env_recovers_after_a_timeout(connect: Callable[..., Any]) -> None:
    # A cold pool cannot start a worker and import math-verify in 10 ms: the check times out,
    # its worker is killed, and the next check runs on a fresh pool.
    async with serve_server(MathEnv, name="math", options={"verify_timeout": 0.01}) as (
        url,
        server,
    ):
        env = connect(url)
        status, body = await env.verify(_task("1/2"), "\\boxed{0.5}")
        assert (status, body["error"]["type"]) == (504, "deadline_exceeded")
        assert isinstance(server, MathEnv)
        server.check_timeout = 30.0
        status, verified = await env.verify(_task("1/2"), "\\boxed{0.5}")
    assert status == 200 and verified["reward"] == 1.0


async def test_a_check_lost_to_a_broken_pool_runs_once_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another check's timeout kills the shared pool; the checks beside it are not at fault.
    async with serve_server(MathEnv, name="math") as (_, server):
        assert isinstance(server, MathEnv)
        calls = []
        real_run_cpu = server.run_cpu

        async def flaky_run_cpu(fn: Any, *args: Any, timeout: float | None = None) -> Any:
            calls.append(args)
            if len(calls) == 1:
                raise BrokenProcessPool("a worker was killed")
            return await real_run_cpu(fn, *args, timeout=timeout)

        monkeypatch.setattr(server, "run_cpu", flaky_run_cpu)
        result = await server._check("1/2", "\\boxed{0.5}")
        assert result == MathCheck(True, True, True)
        assert len(calls) == 2

        # A second break in a row is this check's own problem: it is not retried again.
        calls.clear()

        async def broken_run_cpu(fn: Any, *args: Any, timeout: float | None = None) -> Any:
            calls.append(args)
            raise BrokenProcessPool("still broken")

        monkeypatch.setattr(server, "run_cpu", broken_run_cpu)
        with pytest.raises(BrokenProcessPool):
            await server._check("1/2", "\\boxed{0.5}")
        assert len(calls) == 2
