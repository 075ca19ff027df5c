"""The process of the only collect worker crashes mid-run (SIGKILL, not ``ray.kill``): Ray
restarts it, the run waits for it instead of calling it dead, finishes every rollout, and
``metrics.json`` says the worker was restarted and where it runs now."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rollgym.collect import Collector, RolloutPolicy, prepare_run
from rollgym.ray import RayDispatcher, RayServers
from tests.support.ledger import ledger_counts
from tests.support.stack import stack_config, write_tasks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

TASKS, REPEATS, CONCURRENCY = 30, 3, 6


async def test_a_crashed_worker_process_is_restarted_not_given_up(
    ray_cluster: Any, tmp_path: Path
) -> None:
    cfg = stack_config(
        {"repeats": REPEATS, "concurrency": CONCURRENCY},
        model={"options": {"latency": 0.03}},
        replicas=1,
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", TASKS)
    out = tmp_path / "out"
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    async with RayServers(cfg, log_dir=out / "logs") as servers:
        dispatcher = RayDispatcher(
            RolloutPolicy.from_collect(cfg.collect), CONCURRENCY, servers=servers, workers=1
        )
        collector = Collector(prepared, servers.urls, dispatcher=dispatcher, progress=False)
        run = asyncio.create_task(collector.execute())
        await wait_until(
            lambda: collector.ledger.succeeded >= 15 or run.done(), 60, "15 rollouts recorded"
        )
        assert not run.done(), "the run finished before the crash"
        (before,) = dispatcher.placements
        os.kill(before["pid"], signal.SIGKILL)
        outcome = await run
    assert outcome.status == "completed", outcome.abort_reason
    assert ledger_counts(out) == (TASKS * REPEATS, 0)
    (worker,) = outcome.metrics["ray"]["workers"]
    assert worker["restarts"] == 1
    assert worker["pid"] != before["pid"]
    assert worker["node_id"] and worker["node_ip"]
    assert outcome.metrics["ray"]["requeued"] > 0
