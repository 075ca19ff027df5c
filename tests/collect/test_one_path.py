"""One rollout path: the circuit hold, the failure budget and the failed-to-start check behave
the same in a local run, a ``--ray`` run, a run with the agent in the collector's process
(``in_process``) and the trainer API, because all of them run the same rollout core, recorder
and orchestration. Each test runs every mode against the same real servers (a model that goes
down on cue, echo env, tool agent on 127.0.0.1; ``in_process`` builds its own tool agent from
the config, with the same peers and policies). Only the ``ray`` mode needs Ray: without it,
that mode is skipped."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import (
    Dispatcher,
    LocalDispatcher,
    RolloutPolicy,
    RunningServers,
    RunOutcome,
    run_collection,
)
from rollgym.errors import LaunchError, RunAborted
from rollgym.trainer import BudgetRules, RolloutClient
from tests.support.ledger import error_chain, read_jsonl
from tests.support.stack import (
    Stack,
    fast_policy,
    running_stack,
    stack_config,
    task_row,
    write_tasks,
)

pytestmark = pytest.mark.timeout(120)

MODES = ["local", "ray", "in_process", "trainer"]


@asynccontextmanager
async def model_down(down_for: float, breaker: dict[str, Any]) -> AsyncIterator[Stack]:
    """The stack, its model answering 503 (like an overloaded vLLM) for ``down_for`` seconds
    from its first request; the agent tries each model call once, with ``breaker``."""
    async with running_stack(
        model_options={"fail_status": 503, "down_for": down_for},
        model_retry={"max_attempts": 1, "breaker": breaker},
    ) as stack:
        yield stack


async def collect_run(
    mode: str,
    tmp_path: Path,
    urls: dict[str, list[str]],
    n: int,
    model_retry: dict[str, Any] | None = None,
    **collect: Any,
) -> RunOutcome:
    """``n`` tasks through the one run orchestration, dispatched locally or over Ray, or with
    the agent in this process (built from the config: ``model_retry`` is laid over its policy
    to the model, as ``running_stack`` does for the served agent)."""
    in_process = mode == "in_process"
    model = {"retry": fast_policy("model", **(model_retry or {})).model_dump()}
    cfg = stack_config({"rollout_timeout": 30, "agent_in_process": in_process, **collect},
                       model=model)  # fmt: skip
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    policy = RolloutPolicy.from_collect(cfg.collect)
    dispatcher: Dispatcher | None
    if in_process:
        urls = {name: found for name, found in urls.items() if name != "agent"}
        dispatcher = None
    elif mode == "local":
        dispatcher = LocalDispatcher(policy, cfg.collect.concurrency)
    else:
        from rollgym.ray import RayDispatcher  # only this mode may import Ray

        dispatcher = RayDispatcher(policy, cfg.collect.concurrency, workers=2)
    return await run_collection(
        cfg, cfg.collect, tasks, tmp_path / "out", RunningServers(urls, timeout=3),
        dispatcher=dispatcher, progress=False,
    )  # fmt: skip


def root_type(error: dict[str, Any]) -> str:
    return str(error_chain(error)[-1]["type"])


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")  # skips this mode where Ray is not installed
    return str(request.param)


async def test_a_short_outage_holds_rollouts_at_the_open_circuit(mode: str, tmp_path: Path) -> None:
    """The model is down for 1 s: the agent's breaker to it opens after 2 failed calls; every
    rollout refused by the open circuit is held and re-sent, none recorded as circuit_open."""
    breaker = {"consecutive_failures": 2, "cooldown": 0.5}
    n, concurrency = 16, 4
    async with model_down(1.0, breaker) as stack:
        if mode == "trainer":
            async with RolloutClient(stack.agent_url) as client:
                groups = await client.collect(
                    [task_row(i) for i in range(n)], concurrency=concurrency, rollout_timeout=30
                )
            failed = [r.error.to_dict() for g in groups for r in g.failed]
            holds = None
        else:
            outcome = await collect_run(
                mode, tmp_path, stack.urls, n, {"max_attempts": 1, "breaker": breaker},
                concurrency=concurrency,
            )  # fmt: skip
            assert outcome.status in ("completed", "completed_with_failures"), outcome
            failed = [f["error"] for f in read_jsonl(tmp_path / "out" / "failures.jsonl")]
            holds = outcome.metrics["dispatch"]["circuit_holds"]
            # The agent that ran is the one this mode meant: in this process, or served.
            assert outcome.metrics.get("agents_in_process") == (
                ["agent"] if mode == "in_process" else None
            )
        refused = stack.model.faults
    assert refused >= 2
    # Only rollouts already in flight when the model went down can fail; the rest were held.
    assert len(failed) <= concurrency, failed
    assert all(root_type(e) != "circuit_open" for e in failed), failed
    assert len(failed) < n
    if holds is not None:
        assert holds > 0


async def test_a_broken_model_trips_the_failure_budget(mode: str, tmp_path: Path) -> None:
    """The model stays down: the run (or batch) aborts after about 10 rollouts, not 200, and
    the summary names the model and its status."""
    n = 200
    async with model_down(3600, {"enabled": False}) as stack:
        if mode == "trainer":
            budget = BudgetRules(max_failure_rate=0.5, min_failure_samples=10)
            async with RolloutClient(stack.agent_url) as client:
                with pytest.raises(RunAborted) as caught:
                    await client.collect([task_row(i) for i in range(n)], concurrency=4,
                                         budget=budget)  # fmt: skip
            summary = orjson.loads(caught.value.body or "{}")
            assert "--max-failure-rate" in caught.value.message
        else:
            outcome = await collect_run(
                mode, tmp_path, stack.urls, n, {"max_attempts": 1, "breaker": {"enabled": False}},
                concurrency=4, min_failure_samples=10,
            )  # fmt: skip
            assert outcome.status == "aborted" and outcome.exit_code == 2
            run_info = orjson.loads((tmp_path / "out" / "run.json").read_bytes())
            assert run_info["status"] == "aborted"
            summary = run_info["abort"]
            assert "--max-failure-rate" in summary["reason"]
            recorded = outcome.metrics["counts"]["succeeded"] + outcome.metrics["counts"]["failed"]
            assert 10 <= recorded < 50, recorded
    assert summary["by_server"] == {"model": summary["by_server"]["model"]}
    assert summary["by_status"].get("503", 0) >= 10


async def test_an_agent_that_never_answers_fails_to_start(
    mode: str, tmp_path: Path, dead_url: Callable[[], str]
) -> None:
    """Nothing listens at the agent's URL (with the agent in process: at its model's):
    nothing is dispatched; the run is marked failed_to_start (a plain rerun is allowed), the
    trainer raises the same LaunchError."""
    dead = "model" if mode == "in_process" else "agent"
    urls = {dead: [dead_url()], "env": [dead_url()]} if dead == "model" else {"agent": [dead_url()]}
    if mode == "trainer":
        async with RolloutClient(urls["agent"]) as client:
            with pytest.raises(LaunchError, match=r"agent at http://127\.0\.0\.1"):
                await client.collect([task_row(0)])
    else:
        with pytest.raises(LaunchError, match=rf"{dead} at http://127\.0\.0\.1"):
            await collect_run(mode, tmp_path, urls, 3)
        out = tmp_path / "out"
        run_info = orjson.loads((out / "run.json").read_bytes())
        assert run_info["status"] == "failed_to_start"
        assert run_info["error"]["type"] == "launch_error"
        assert not read_jsonl(out / "failures.jsonl") and not (out / "rollouts.jsonl").exists()
        # Marked as never started: the same directory takes a new run at once.
        with pytest.raises(LaunchError):
            await collect_run(mode, tmp_path, urls, 3)
