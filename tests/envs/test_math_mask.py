"""``MathEnv`` masks a check whose pool broke twice while other checks ran beside it: a dead
worker breaks every check on its pool, so that answer may be an innocent neighbour of the one
that kills workers, and a 0 would be a reward it may not deserve. Alone, the answer broke the
pool itself and scores 0 (``tests/envs/test_math.py``)."""

from __future__ import annotations

import asyncio
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

from rollgym.envs.math.server import MathEnv
from rollgym.server.resources import Session
from rollgym.testing import serve_server
from rollgym.wire import MASK_SAMPLE
from tests.envs.env_client import reply

pytestmark = pytest.mark.timeout(60)


def _task(expected: str) -> dict[str, Any]:
    return {"responses_create_params": {"input": "Solve it."}, "expected_answer": expected}


async def test_a_check_broken_twice_beside_others_is_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serve_server(MathEnv, name="math") as (_, server):
        assert isinstance(server, MathEnv)
        both_in = asyncio.Barrier(2)

        async def run_cpu(fn: Any, *args: Any, timeout: float | None = None) -> Any:
            await both_in.wait()  # both checks are on the pool when it breaks
            raise BrokenProcessPool("a worker was killed")

        monkeypatch.setattr(server, "run_cpu", run_cpu)
        session = Session(id="s", task={})
        verified = await asyncio.gather(
            server.verify(session, _task("3"), reply("\\boxed{3}")),
            server.verify(session, _task("4"), reply("kills the worker")),
        )
    for one in verified:
        assert one == {"reward": 0.0, "answer_parsed": 0, "reason": "check_crashed",
                       MASK_SAMPLE: True}  # fmt: skip
