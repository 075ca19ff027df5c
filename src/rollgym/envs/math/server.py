"""``MathEnv``: math answers checked symbolically, off the event loop, under a deadline, with
the same reward as NeMo Gym 0.4.0's ``math_with_judge`` with its judge off.

Task field ``expected_answer`` is the gold answer in any form math-verify reads (``12``,
``\\frac{3}{4}``, ``3\\sqrt{2}``, ``x^2+1``, with or without outer ``$...$`` or ``\\(...\\)``). The
reply is all the assistant's output text (``protocol.output_text``); the answer is extracted from it
as ``check.py`` says, so ``1/2``, ``0.5`` and ``\\frac{1}{2}`` score the same. Metric
``answer_parsed`` (1/0) separates "no readable answer" from "wrong answer". Unlike NeMo Gym,
``question`` is not required (there is no judge), a numeric ``expected_answer`` is read as text, a
gold that math-verify cannot parse is refused (422) instead of scoring 0, and an answer that only
restates the problem (the prompt given back, or its expression boxed:
``\\boxed{\\frac{3}{4} + \\frac{1}{8}}`` for "Compute $\\frac{3}{4} + \\frac{1}{8}$", which
math-verify evaluates to the gold) scores 0 with ``reason`` ``restates_problem`` (``check.py`` says
what counts). The problem is the text of the prompt's messages and ``question``.

Option ``verify_timeout`` (seconds, default 30) bounds each check. The answer is model output, and
an answer must never fail its rollout (a failure is no reward of 0, so a policy would learn that
such answers cost nothing): a check still running at the deadline is abandoned (its pool is retired)
and scores 0 with ``reason`` ``check_timeout``; a check that lost its worker to a broken pool is run
once more, and if it breaks that one too it scores 0 with ``reason`` ``check_crashed`` when it ran
alone (then the answer broke it). A dead worker breaks every check on its pool, so when other checks
ran beside it the answer may be an innocent neighbour of the one that kills workers: then it is
masked (``mask_sample: true``: the reward is no measurement) rather than scored a 0 it may not
deserve. A check that never got a worker before the deadline (the server is overloaded: no fault of
the answer) still fails with ``DeadlineExceeded``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, ClassVar

from pydantic import Field

from rollgym.envs.math.check import MathCheck, check_answer
from rollgym.envs.rows import content_texts, expected_text, mean_field, prompt_items
from rollgym.errors import DeadlineExceeded, InvalidRequest, WaitedTooLong
from rollgym.protocol import output_text
from rollgym.server.base import ServerContext
from rollgym.server.resources import ResourcesServer, Session
from rollgym.wire import MASK_SAMPLE

log = logging.getLogger("rollgym.envs.math")


class MathEnv(ResourcesServer):
    """Math problems; reward 1.0 when the reply's answer equals ``expected_answer``."""

    row_fields = frozenset({"expected_answer"})
    required_row_fields = row_fields
    reverify_mode = "stateless"  # verify reads the row and the reply

    class Options(ResourcesServer.Options):
        verify_timeout: float = Field(default=30.0, gt=0, description="seconds per check")

    options: Options
    # Module-level and picklable: it runs in a spawn worker process.
    checker: ClassVar[staticmethod[[str, str, str], MathCheck]] = staticmethod(check_answer)

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self._attempts: set[_Attempt] = set()

    def cpu_work(self) -> Callable[..., Any]:
        return type(self).checker  # its pool starts with the server, math-verify loaded

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        expected = expected_text(task, "math")
        answer = output_text(response)
        try:
            result = await self._check(expected, answer, problem_text(task))
        except _Unscored as unscored:
            if unscored.masked:
                log.info("%s: answer masked (%s beside other checks)", self.name, unscored.reason)
                return {"reward": 0.0, "answer_parsed": 0, "reason": unscored.reason,
                        MASK_SAMPLE: True}  # fmt: skip
            log.info("%s: answer scored 0 (%s)", self.name, unscored.reason)
            return {"reward": 0.0, "answer_parsed": 0, "reason": unscored.reason}
        if not result.gold_parsed:
            raise InvalidRequest(
                f"math task's expected_answer {expected!r} cannot be parsed by math-verify",
                status=422,
            )
        verified: dict[str, Any] = {
            "reward": 1.0 if result.correct else 0.0,
            "answer_parsed": int(result.answer_parsed),
        }
        if result.restates_problem:
            verified["reason"] = "restates_problem"
        return verified

    async def _check(self, expected: str, answer: str, problem: str) -> MathCheck:
        try:
            with self._attempt():
                return await self._run(expected, answer, problem)
        except BrokenProcessPool:
            # A worker that dies (out of memory, a crash in native code, killed) breaks the
            # whole pool and fails every check in flight on it, most of them innocent. The work
            # is pure, so run it once more on a fresh pool.
            log.info("%s: check lost to a broken worker pool, running it once more", self.name)
        with self._attempt() as attempt:
            try:
                return await self._run(expected, answer, problem)
            except BrokenProcessPool:
                # Alone on the pool, the answer broke it: its own failure. Beside others, it
                # may be their doing: no measurement.
                raise _Unscored("check_crashed", masked=attempt.shared) from None

    @contextmanager
    def _attempt(self) -> Iterator[_Attempt]:
        """One run of a check, marked ``shared`` if any other check runs while it does."""
        attempt = _Attempt()
        if self._attempts:
            attempt.shared = True
            for other in self._attempts:
                other.shared = True
        self._attempts.add(attempt)
        try:
            yield attempt
        finally:
            self._attempts.discard(attempt)

    async def _run(self, expected: str, answer: str, problem: str) -> MathCheck:
        try:
            result: MathCheck = await self.run_cpu(
                type(self).checker, expected, answer, problem, timeout=self.options.verify_timeout
            )
        except DeadlineExceeded as exc:
            # math-verify bounds its own parse and compare (5 s each); a check past the
            # deadline is stuck in work no signal interrupts: the answer's doing. One that
            # waited for a worker all along is the server's (run_cpu says which).
            if isinstance(exc, WaitedTooLong):
                raise
            raise _Unscored("check_timeout") from None
        return result

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        return mean_field(rollouts, "answer_parsed", "answer_parse_rate")


def problem_text(task: dict[str, Any]) -> str:
    """The problem an answer must not merely restate: the text of the prompt's messages, and
    the row's ``question`` if it has one."""
    items = prompt_items(task)
    texts = [items] if isinstance(items, str) else [
        text for item in items if isinstance(item, dict)
        for text in content_texts(item.get("content"))
    ]  # fmt: skip
    question = task.get("question")
    if isinstance(question, str):
        texts.append(question)
    return "\n\n".join(texts)


class _Attempt:
    shared = False


class _Unscored(Exception):
    """The answer could not be checked: it scores 0 with ``reason``, or is ``masked`` when that
    may not be its own fault."""

    def __init__(self, reason: str, *, masked: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.masked = masked
