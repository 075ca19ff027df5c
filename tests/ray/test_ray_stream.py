"""The streaming API with its rollouts on Ray worker actors (``dispatcher=RayDispatcher``), on
the local two-node cluster: groups as they finish, and a pause that aborts model calls in the
middle of the run, then a resume; every rollout recorded exactly once, none failed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rollgym.ray import RayDispatcher
from rollgym.trainer import PolicyControl, RolloutClient, ScoredRollout
from rollgym.wire import ABORTED_VERSIONS
from tests.support.stack import running_stack, task_row
from tests.support.waiting import wait_until
from tests.test_stream import assert_ledger_exact

pytestmark = pytest.mark.timeout(120)


async def test_a_stream_on_ray_workers_through_a_pause_and_resume(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rows = [task_row(i) for i in range(48)]
    async with (
        running_stack(model_options={"latency": 0.3}) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        gate = stack.model.policy
        stream = client.stream(
            rows, repeats=2, concurrency=32, dispatcher=RayDispatcher,
            control=PolicyControl(stack.urls["model"]), output=tmp_path / "run",
        )  # fmt: skip
        async with stream:
            it = aiter(stream)
            first = await anext(it)
            await wait_until(lambda: gate.in_flight >= 8, timeout=30, what="calls upstream")
            answers = await stream.pause(abort=True, timeout_s=60)
            aborted = sum(a.aborted for a in answers)
            assert aborted > 0
            await stream.resume(1)
            groups = [first, *[g async for g in it]]
    assert sorted(g.task_index for g in groups) == list(range(48))
    records = [r for g in groups for r in g.rollouts]
    assert all(isinstance(r, ScoredRollout) for r in records) and len(records) == 96
    assert stream.stats.failed == 0 and stream.stats.stale == 0
    re_issued = [
        call for r in records for call in r.response["rollgym_upstream"]
        if call.get(ABORTED_VERSIONS) == [0]
    ]  # fmt: skip
    assert len(re_issued) == aborted
    info = assert_ledger_exact(tmp_path / "run")
    assert info["status"] == "completed"


async def test_a_stream_survives_a_crashed_ray_worker(ray_cluster: Any, tmp_path: Path) -> None:
    """The only worker's process is killed (SIGKILL) while its rollouts wait at a paused model:
    Ray restarts it, the rollouts it had not reported go back to the stream's feed and run
    again; every rollout is recorded exactly once."""
    made: list[RayDispatcher] = []

    def one_worker(policy: Any, concurrency: int) -> RayDispatcher:
        made.append(RayDispatcher(policy, concurrency, workers=1))
        return made[-1]

    rows = [task_row(i) for i in range(12)]
    async with (
        running_stack() as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        gate = stack.model.policy
        control = PolicyControl(stack.urls["model"])
        stream = client.stream(
            rows, repeats=2, concurrency=8, dispatcher=one_worker, control=control,
            output=tmp_path / "run",
        )  # fmt: skip
        async with stream:
            # The model server holds every call (the stream itself is not paused: it keeps
            # dispatching, and the rollouts pile up at the model).
            await control.pause(timeout_s=60)
            await wait_until(lambda: gate.held >= 4, timeout=60, what="calls held")
            (where,) = made[0].placements
            os.kill(where["pid"], signal.SIGKILL)
            await wait_until(lambda: made[0].placements[0]["pid"] != where["pid"], timeout=90,
                             what="the worker restarted")  # fmt: skip
            await control.resume(1)
            groups = [g async for g in stream]
    assert sorted(g.task_index for g in groups) == list(range(12))
    assert all(g.complete for g in groups)
    assert stream.stats.dispatched == 24 and stream.stats.failed == 0
    assert_ledger_exact(tmp_path / "run")
