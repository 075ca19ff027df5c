"""Faults on the cluster mid-run: a replica's process dies, a collect worker dies. The run
completes and the ledger keeps its invariant: nothing lost, nothing recorded twice."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
import ray

from rollgym.collect import Collector, RolloutPolicy, prepare_run
from rollgym.ray import RayDispatcher, RayServers

pytestmark = pytest.mark.timeout(120)

TASKS, REPEATS, CONCURRENCY = 40, 3, 8


def _failures(out: Path) -> list[dict[str, Any]]:
    path = out / "failures.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def dispatcher_of(collector: Collector) -> RayDispatcher:
    assert isinstance(collector.dispatcher, RayDispatcher)
    return collector.dispatcher


async def _run_with_fault(stack: Any, tmp_path: Path, fault: Any, **config: Any) -> Any:
    """Run with a slow model; once 20 rollouts are recorded, ``fault(servers, collector)``."""
    cfg = stack.config(
        latency=0.03, collect={"repeats": REPEATS, "concurrency": CONCURRENCY}, **config
    )
    tasks = stack.write_tasks(tmp_path / "tasks.jsonl", TASKS)
    out = tmp_path / "out"
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    async with RayServers(cfg, log_dir=out / "logs") as servers:
        dispatcher = RayDispatcher(
            RolloutPolicy.from_collect(cfg.collect), CONCURRENCY, servers=servers, workers=2
        )
        collector = Collector(prepared, servers.urls, dispatcher=dispatcher, progress=False)
        run = asyncio.create_task(collector.execute())
        await stack.wait_until(lambda: collector.ledger.succeeded >= 20 or run.done(), 60)
        assert not run.done(), "the run finished before the fault"
        await fault(servers, collector)
        outcome = await run
    assert outcome.status in ("completed", "completed_with_failures"), outcome.abort_reason
    return outcome, out


async def test_agent_replica_dies_mid_run(ray_cluster: Any, stack: Any, tmp_path: Path) -> None:
    async def kill_agent(servers: RayServers, collector: Collector) -> None:
        await servers.kill("agent", 1)

    outcome, out = await _run_with_fault(stack, tmp_path, kill_agent)
    succeeded, failed = stack.invariant(out)
    assert succeeded + failed == TASKS * REPEATS
    # Only rollouts in flight on the dead replica fail (``/run`` is not replayed); the rest
    # went to the live replica.
    assert failed <= 2 * CONCURRENCY
    for failure in _failures(out):
        err = failure["error"]
        assert err["server"] == "agent"
        assert err["type"] in ("connection_lost", "connect_error"), err
    lost = outcome.metrics["ray"]["replicas_lost"]
    assert [(r["server"], r["replica"]) for r in lost] == [("agent", 1)]
    dead_url = lost[0]["url"]
    assert all(
        r["url"] != dead_url for r in outcome.metrics["ray"]["replicas"] if r["server"] != "agent"
    )


async def test_model_replica_dies_mid_run(ray_cluster: Any, stack: Any, tmp_path: Path) -> None:
    async def kill_model(servers: RayServers, collector: Collector) -> None:
        await servers.kill("model", 0)

    outcome, out = await _run_with_fault(stack, tmp_path, kill_model)
    succeeded, failed = stack.invariant(out)
    assert succeeded + failed == TASKS * REPEATS
    for failure in _failures(out):
        assert failure["error"]["origin"]["server"] == "model"
    lost = outcome.metrics["ray"]["replicas_lost"]
    assert [(r["server"], r["replica"]) for r in lost] == [("model", 0)]


async def test_collect_worker_dies_mid_run(ray_cluster: Any, stack: Any, tmp_path: Path) -> None:
    async def kill_worker(servers: RayServers, collector: Collector) -> None:
        ray.kill(dispatcher_of(collector).actors[0], no_restart=False)  # Ray restarts it

    outcome, out = await _run_with_fault(stack, tmp_path, kill_worker)
    # Its unreported rollouts went back in the queue and ran again: all of them succeed.
    assert stack.invariant(out) == (TASKS * REPEATS, 0)
    assert outcome.status == "completed"
    assert outcome.metrics["ray"]["requeued"] > 0
