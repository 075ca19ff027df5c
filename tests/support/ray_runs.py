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
    in_flight: bool = False
    """Inject the fault only once every one of the run's ``concurrency`` rollouts waits on the
    model (held there until the fault is in): it then lands on rollouts in flight for sure,
    however busy the machine is."""


async def run_with_fault(shape: FaultRun, tmp_path: Path, fault: Fault) -> tuple[RunOutcome, Path]:
    """Run the stack on the cluster with a slow model (so the run lasts); once ``fault_after``
    rollouts are recorded (and, with ``in_flight``, every slot waits on the model),
    ``await fault(servers, dispatcher)``; return (outcome, output dir)."""
    hold, held = tmp_path / "hold", tmp_path / "held.log"
    model: dict[str, object] = {"options": {"latency": 0.03}}
    if shape.in_flight:
        options = {"latency": 0.03, "hold_while_exists": str(hold), "held_log": str(held)}
        model = {"impl": "tests.support.servers:FaultyModel", "options": options}
    cfg = stack_config(
        {"repeats": shape.repeats, "concurrency": shape.concurrency},
        model=model,
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
        if shape.in_flight:
            hold.touch()
            await wait_until(
                lambda: len(_rollouts_held(held)) >= shape.concurrency or run.done(),
                60, f"all {shape.concurrency} rollouts in flight waiting on the model",
            )  # fmt: skip
        try:
            await fault(servers, dispatcher)
        finally:
            hold.unlink(missing_ok=True)
        outcome = await run
    return outcome, out


def _rollouts_held(log: Path) -> set[str]:
    """The rollouts with a model call held (a retried call is the same rollout)."""
    return set(log.read_text().split()) if log.exists() else set()
