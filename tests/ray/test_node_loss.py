"""A node dies mid-run: the collect worker that lived on it is replaced on a live node, its
unreported rollouts run again there, and the run completes with every rollout recorded once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollgym.collect import Collector, RolloutPolicy, prepare_run
from rollgym.ray import RayDispatcher
from tests.conftest import RAY_NODE
from tests.support.ledger import ledger_counts
from tests.support.stack import running_stack, stack_config, write_tasks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

TASKS, REPEATS, CONCURRENCY = 40, 3, 6


async def test_a_worker_whose_node_dies_is_replaced_on_a_live_node(
    ray_cluster: Any, tmp_path: Path
) -> None:
    extra = ray_cluster.add_node(**RAY_NODE)  # removed below: the shared cluster stays as it was
    ray_cluster.wait_for_nodes()
    doomed = extra.node_id
    removed = False
    try:
        cfg = stack_config({"repeats": REPEATS, "concurrency": CONCURRENCY})
        tasks = write_tasks(tmp_path / "tasks.jsonl", TASKS)
        out = tmp_path / "out"
        prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
        # The servers run in this process: only the collect workers are on the cluster.
        async with running_stack(model_options={"latency": 0.03}) as stack:
            dispatcher = RayDispatcher(RolloutPolicy.from_collect(cfg.collect), CONCURRENCY)
            collector = Collector(prepared, stack.urls, dispatcher=dispatcher, progress=False)
            run = asyncio.create_task(collector.execute())
            await wait_until(lambda: len(dispatcher.placements) == 3 or run.done(), 60, "workers")
            placed = [w["node_id"] for w in dispatcher.placements]
            assert len(set(placed)) == 3, "one worker per node, for real"
            victim = placed.index(doomed)
            await wait_until(
                lambda: collector.ledger.succeeded >= 15 or run.done(), 60, "15 rollouts"
            )
            assert not run.done(), "the run finished before the node died"
            ray_cluster.remove_node(extra, allow_graceful=False)
            removed = True
            outcome = await run
    finally:
        if not removed:
            ray_cluster.remove_node(extra, allow_graceful=False)
    assert outcome.status == "completed", outcome.abort_reason
    assert ledger_counts(out) == (TASKS * REPEATS, 0)
    workers = outcome.metrics["ray"]["workers"]
    assert workers[victim]["restarts"] == 1
    assert workers[victim]["node_id"] != doomed
    assert all(w["restarts"] == 0 for i, w in enumerate(workers) if i != victim)
