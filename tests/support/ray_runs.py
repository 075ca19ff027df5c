"""A run on the test Ray cluster with a fault injected midway. Imports Ray: for ``tests/ray``
only (its modules cannot import each other, so the helper lives here)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from rollgym.collect import Collector, RolloutPolicy, RunOutcome, prepare_run
from rollgym.ray import RayDispatcher, RayServers

from .stack import stack_config, write_tasks
from .waiting import wait_until

Fault = Callable[[RayServers, RayDispatcher], Awaitable[None]]


@dataclass(frozen=True)
class FaultRun:
    """The shape of the run: its size, and how many replicas and collect workers it has."""

    tasks: int
    repeats: int
    concurrency: int
    replicas: int
    workers: int
    fault_after: int
    """Recorded successes before the fault is injected."""


async def run_with_fault(shape: FaultRun, tmp_path: Path, fault: Fault) -> tuple[RunOutcome, Path]:
    """Run the stack on the cluster with a slow model (so the run lasts); once ``fault_after``
    rollouts are recorded, ``await fault(servers, dispatcher)``; return (outcome, output dir)."""
    cfg = stack_config(
        {"repeats": shape.repeats, "concurrency": shape.concurrency},
        model={"options": {"latency": 0.03}},
        replicas=shape.replicas,
    )
    tasks = write_tasks(tmp_path / "tasks.jsonl", shape.tasks)
    out = tmp_path / "out"
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    async with RayServers(cfg, log_dir=out / "logs") as servers:
        dispatcher = RayDispatcher(
            RolloutPolicy.from_collect(cfg.collect), shape.concurrency, servers=servers,
            workers=shape.workers,
        )  # fmt: skip
        collector = Collector(prepared, servers.urls, dispatcher=dispatcher, progress=False)
        run = asyncio.create_task(collector.execute())
        await wait_until(
            lambda: collector.ledger.succeeded >= shape.fault_after or run.done(),
            60, f"{shape.fault_after} rollouts recorded",
        )  # fmt: skip
        assert not run.done(), "the run finished before the fault"
        await fault(servers, dispatcher)
        outcome = await run
    return outcome, out
