"""``MathEnv``: math answers checked symbolically, off the event loop, under a deadline, with
the same reward as NeMo Gym 0.4.0's ``math_with_judge`` with its judge off.

Task field ``expected_answer`` is the gold answer in any form math-verify reads (``12``,
``\\frac{3}{4}``, ``3\\sqrt{2}``, ``x^2+1``, with or without outer ``$...$`` or ``\\(...\\)``).
The reply is all the assistant's output text (``protocol.output_text``); the answer is extracted
from it as NeMo Gym does (``check.py``), so ``1/2``, ``0.5`` and ``\\frac{1}{2}`` score the
same. Metric ``answer_parsed`` (1/0) separates "no readable answer" from "wrong answer".
Unlike NeMo Gym, ``question`` is not required (there is no judge), a numeric ``expected_answer``
is read as text, and a gold that math-verify cannot parse is refused (422) instead of scoring 0.

Option ``verify_timeout`` (seconds, default 30) bounds each check; a check still running then is
abandoned (its pool is retired) and the verify fails with ``DeadlineExceeded`` (NeMo Gym scores
it 0: a failure is not a reward); a check that lost its worker to a broken pool is run once more.
"""

from __future__ import annotations

import logging
from concurrent.futures.process import BrokenProcessPool
from typing import Any, ClassVar

from pydantic import Field

from rollgym.envs.math.check import MathCheck, check_answer
from rollgym.errors import InvalidRequest
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session

log = logging.getLogger("rollgym.envs.math")


class MathEnv(ResourcesServer):
    """Math problems; reward 1.0 when the reply's answer equals ``expected_answer``."""

    class Options(ResourcesServer.Options):
        verify_timeout: float = Field(default=30.0, gt=0, description="seconds per check")

    options: Options
    # Module-level and picklable: it runs in a spawn worker process.
    checker: ClassVar[staticmethod[[str, str], MathCheck]] = staticmethod(check_answer)

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, float | int]:
        expected = task.get("expected_answer")
        if isinstance(expected, (int, float)) and not isinstance(expected, bool):
            expected = str(expected)
        if not isinstance(expected, str) or not expected.strip():
            raise InvalidRequest(
                "math task needs 'expected_answer' (a non-empty string)", status=422
            )
        result = await self._check(expected, output_text(response))
        if not result.gold_parsed:
            raise InvalidRequest(
                f"math task's expected_answer {expected!r} cannot be parsed by math-verify",
                status=422,
            )
        return {
            "reward": 1.0 if result.correct else 0.0,
            "answer_parsed": int(result.answer_parsed),
        }

    async def _check(self, expected: str, answer: str) -> MathCheck:
        try:
            result: MathCheck = await self.run_cpu(
                type(self).checker, expected, answer, timeout=self.options.verify_timeout
            )
        except BrokenProcessPool:
            # A worker that dies (out of memory, a crash in native code, killed) breaks the
            # whole pool and fails every check in flight on it, most of them innocent. The work
            # is pure, so run it once more on a fresh pool; a second failure is its own.
            log.info("%s: check lost to a broken worker pool, running it once more", self.name)
            result = await self.run_cpu(
                type(self).checker, expected, answer, timeout=self.options.verify_timeout
            )
        return result

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        flags = [
            float(r["answer_parsed"])
            for r in rollouts
            if isinstance(r.get("answer_parsed"), (int, float))
        ]
        if not flags:
            return {}
        return {"answer_parse_rate": sum(flags) / len(flags)}
