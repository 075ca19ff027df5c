"""The process of the only collect worker crashes mid-run (SIGKILL, not ``ray.kill``): Ray
restarts it, the run waits for it instead of calling it dead, finishes every rollout, and
``metrics.json`` says the worker was restarted and where it runs now."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rollgym.ray import RayDispatcher, RayServers
from tests.support.ledger import ledger_counts
from tests.support.ray_runs import FaultRun, run_with_fault

pytestmark = pytest.mark.timeout(180)

TASKS, REPEATS, CONCURRENCY = 30, 3, 6
# Crashed while it runs rollouts (held at the model): some are unreported for sure.
SHAPE = FaultRun(TASKS, REPEATS, CONCURRENCY, replicas=1, workers=1, fault_after=15, in_flight=True)


async def test_a_crashed_worker_process_is_restarted_not_given_up(
    ray_cluster: Any, tmp_path: Path
) -> None:
    placed: list[dict[str, Any]] = []

    async def crash_worker(servers: RayServers, dispatcher: RayDispatcher) -> None:
        (before,) = dispatcher.placements
        placed.append(before)
        os.kill(before["pid"], signal.SIGKILL)

    outcome, out = await run_with_fault(SHAPE, tmp_path, crash_worker)
    (before,) = placed
    assert outcome.status == "completed", outcome.abort_reason
    assert ledger_counts(out) == (TASKS * REPEATS, 0)
    (worker,) = outcome.metrics["ray"]["workers"]
    assert worker["restarts"] == 1
    assert worker["pid"] != before["pid"]
    assert worker["node_id"] and worker["node_ip"]
    assert outcome.metrics["ray"]["requeued"] > 0
