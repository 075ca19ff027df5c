"""Faults on the cluster mid-run: a replica's process dies, a collect worker dies. The run
completes and the ledger keeps its invariant: nothing lost, nothing recorded twice."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray

from rollgym.collect import RunOutcome
from rollgym.ray import RayDispatcher, RayServers
from tests.support.ledger import ledger_counts, read_jsonl
from tests.support.ray_runs import Fault, FaultRun, run_with_fault

pytestmark = pytest.mark.timeout(120)

TASKS, REPEATS, CONCURRENCY = 40, 3, 8
SHAPE = FaultRun(TASKS, REPEATS, CONCURRENCY, replicas=2, workers=2, fault_after=20)
IN_FLIGHT = replace(SHAPE, in_flight=True)


async def _run_with_fault(
    tmp_path: Path, fault: Fault, shape: FaultRun = SHAPE
) -> tuple[RunOutcome, Path]:
    outcome, out = await run_with_fault(shape, tmp_path, fault)
    assert outcome.status in ("completed", "completed_with_failures"), outcome.abort_reason
    return outcome, out


async def test_agent_replica_dies_mid_run(ray_cluster: Any, tmp_path: Path) -> None:
    async def kill_agent(servers: RayServers, dispatcher: RayDispatcher) -> None:
        await servers.kill("agent", 1)

    outcome, out = await _run_with_fault(tmp_path, kill_agent)
    succeeded, failed = ledger_counts(out)
    assert succeeded + failed == TASKS * REPEATS
    # Only rollouts in flight on the dead replica fail (``/run`` is not replayed); the rest
    # went to the live replica.
    assert failed <= 2 * CONCURRENCY
    for failure in read_jsonl(out / "failures.jsonl"):
        err = failure["error"]
        assert err["server"] == "agent"
        assert err["type"] in ("connection_lost", "connect_error"), err
    lost = outcome.metrics["ray"]["replicas_lost"]
    assert [(r["server"], r["replica"]) for r in lost] == [("agent", 1)]
    dead_url = lost[0]["url"]
    assert all(
        r["url"] != dead_url for r in outcome.metrics["ray"]["replicas"] if r["server"] != "agent"
    )


async def test_model_replica_dies_mid_run(ray_cluster: Any, tmp_path: Path) -> None:
    async def kill_model(servers: RayServers, dispatcher: RayDispatcher) -> None:
        await servers.kill("model", 0)

    outcome, out = await _run_with_fault(tmp_path, kill_model)
    succeeded, failed = ledger_counts(out)
    assert succeeded + failed == TASKS * REPEATS
    for failure in read_jsonl(out / "failures.jsonl"):
        assert failure["error"]["origin"]["server"] == "model"
    lost = outcome.metrics["ray"]["replicas_lost"]
    assert [(r["server"], r["replica"]) for r in lost] == [("model", 0)]


async def test_collect_worker_dies_mid_run(ray_cluster: Any, tmp_path: Path) -> None:
    async def kill_worker(servers: RayServers, dispatcher: RayDispatcher) -> None:
        ray.kill(dispatcher.actors[0], no_restart=False)  # Ray restarts it

    # Killed while it runs rollouts (held at the model), not between two chunks of work.
    outcome, out = await _run_with_fault(tmp_path, kill_worker, IN_FLIGHT)
    # Its unreported rollouts went back in the queue and ran again: all of them succeed.
    assert ledger_counts(out) == (TASKS * REPEATS, 0)
    assert outcome.status == "completed"
    assert outcome.metrics["ray"]["requeued"] > 0
