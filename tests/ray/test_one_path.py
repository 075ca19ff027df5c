"""One rollout path: the circuit hold, the failure budget and the failed-to-start check behave
the same in a local run, a ``--ray`` run and the trainer API, because all three run the same
rollout core, recorder and orchestration. Each test runs every mode against the same real
servers (scripted model, echo env, tool agent on 127.0.0.1) and a switch that takes the model
down: an aiohttp proxy in front of it."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from rollgym.collect import (
    Dispatcher,
    LocalDispatcher,
    RolloutPolicy,
    RunningServers,
    RunOutcome,
    run_collection,
)
from rollgym.config import RetryPolicy, parse_config
from rollgym.errors import LaunchError, RunAborted
from rollgym.http import Target
from rollgym.ray import RayDispatcher
from rollgym.testing import serve_server
from rollgym.trainer import BudgetRules, RolloutClient

pytestmark = pytest.mark.timeout(120)

MODES = ["local", "ray", "trainer"]


class ModelSwitch:
    """A proxy in front of the model: while down it answers 503 like an overloaded vLLM.
    ``outage`` seconds after its first request it comes back up (``None``: stays down)."""

    def __init__(self, upstream: str, outage: float | None) -> None:
        self.upstream = upstream
        self.outage = outage
        self.first: float | None = None
        self.refused = 0
        self.session: aiohttp.ClientSession | None = None

    def down(self) -> bool:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        return self.outage is None or now - self.first < self.outage

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == "/v1/responses" and self.down():
            self.refused += 1
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-")}
        headers["content-type"] = "application/json"
        timeout = aiohttp.ClientTimeout(total=30)
        async with self.session.post(
            self.upstream + request.path, data=body, headers=headers, timeout=timeout
        ) as resp:
            return web.Response(
                body=await resp.read(), status=resp.status, content_type="application/json"
            )


@asynccontextmanager
async def switched_stack(outage: float | None, breaker: dict[str, Any]) -> AsyncIterator[
    tuple[dict[str, list[str]], ModelSwitch]
]:  # fmt: skip
    """Scripted model behind a ``ModelSwitch``, echo env, tool agent; yield (urls, switch)."""
    async with serve_server("scripted", name="model") as (model_url, _):
        switch = ModelSwitch(model_url, outage)
        app = web.Application()
        app.router.add_post("/{tail:.*}", switch.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        switch_url = f"http://127.0.0.1:{port}"
        model_policy = RetryPolicy.model_validate(
            {"max_attempts": 1, "budget": {"enabled": False}, "breaker": breaker}
        )
        try:
            async with (
                aiohttp.ClientSession() as session,
                serve_server("echo", name="env") as (env_url, _),
            ):
                switch.session = session
                peers = {
                    "model": Target.single("model", switch_url, model_policy),
                    "env": Target.single("env", env_url),
                }
                async with serve_server(
                    "tool_agent", name="agent", peers=peers,
                    options={"model": "model", "resources": "env"},
                ) as (agent_url, _):  # fmt: skip
                    yield {"model": [switch_url], "env": [env_url], "agent": [agent_url]}, switch
        finally:
            await runner.cleanup()


def task_row(i: int) -> dict[str, Any]:
    script = [{"call": "echo", "arguments": {"text": f"v{i}"}}, {"say": "It is {tool_output}"}]
    return {
        "responses_create_params": {"input": f"task {i}", "metadata": {"rollgym_script": script}},
        "expected_answer": f"v{i}",
    }


def config(collect: dict[str, Any]) -> Any:
    # The servers run in this process; the config only names them for the collector.
    return parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted"},
                "env": {"kind": "resources", "impl": "echo"},
                "agent": {"kind": "agent", "impl": "tool_agent",
                          "options": {"model": "model", "resources": "env"}},
            },
            "collect": {"rollout_timeout": 30, **collect},
        },
        "one-path-test",
    )  # fmt: skip


async def collect_run(
    mode: str, tmp_path: Path, urls: dict[str, list[str]], n: int, **collect: Any
) -> RunOutcome:
    """``n`` tasks through the one run orchestration, dispatched locally or over Ray."""
    cfg = config(collect)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(task_row(i)) + b"\n" for i in range(n)))
    policy = RolloutPolicy.from_collect(cfg.collect)
    dispatcher: Dispatcher = (
        LocalDispatcher(policy, cfg.collect.concurrency)
        if mode == "local"
        else RayDispatcher(policy, cfg.collect.concurrency, workers=2)
    )
    return await run_collection(
        cfg, cfg.collect, tasks, tmp_path / "out", RunningServers(urls, timeout=3),
        dispatcher=dispatcher, progress=False,
    )  # fmt: skip


def failures_of(out: Path) -> list[dict[str, Any]]:
    path = out / "failures.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def root_type(error: dict[str, Any]) -> str:
    while isinstance(error.get("origin"), dict):
        error = error["origin"]
    return str(error["type"])


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return str(request.param)


async def test_a_short_outage_holds_rollouts_at_the_open_circuit(mode: str, tmp_path: Path) -> None:
    """The model is down for 1 s: the agent's breaker to it opens after 2 failed calls; every
    rollout refused by the open circuit is held and re-sent, none recorded as circuit_open."""
    breaker = {"consecutive_failures": 2, "cooldown": 0.5}
    n, concurrency = 16, 4
    async with switched_stack(1.0, breaker) as (urls, switch):
        if mode == "trainer":
            async with RolloutClient(urls["agent"]) as client:
                groups = await client.collect(
                    [task_row(i) for i in range(n)], concurrency=concurrency, rollout_timeout=30
                )
            failed = [r.error.to_dict() for g in groups for r in g.failed]
            holds = None
        else:
            outcome = await collect_run(mode, tmp_path, urls, n, concurrency=concurrency)
            assert outcome.status in ("completed", "completed_with_failures"), outcome
            failed = [f["error"] for f in failures_of(tmp_path / "out")]
            holds = outcome.metrics["dispatch"]["circuit_holds"]
    assert switch.refused >= 2
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
    async with switched_stack(None, {"enabled": False}) as (urls, _):
        if mode == "trainer":
            budget = BudgetRules(max_failure_rate=0.5, min_failure_samples=10)
            async with RolloutClient(urls["agent"]) as client:
                with pytest.raises(RunAborted) as caught:
                    await client.collect([task_row(i) for i in range(n)], concurrency=4,
                                         budget=budget)  # fmt: skip
            summary = orjson.loads(caught.value.body or "{}")
            assert "--max-failure-rate" in caught.value.message
        else:
            outcome = await collect_run(
                mode, tmp_path, urls, n, concurrency=4, min_failure_samples=10
            )
            assert outcome.status == "aborted" and outcome.exit_code == 2
            run_info = orjson.loads((tmp_path / "out" / "run.json").read_bytes())
            assert run_info["status"] == "aborted"
            summary = run_info["abort"]
            assert "--max-failure-rate" in summary["reason"]
            recorded = outcome.metrics["counts"]["succeeded"] + outcome.metrics["counts"]["failed"]
            assert 10 <= recorded < 50, recorded
    assert summary["by_server"] == {"model": summary["by_server"]["model"]}
    assert summary["by_status"].get("503", 0) >= 10


def dead_url() -> str:
    """A loopback URL where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_an_agent_that_never_answers_fails_to_start(mode: str, tmp_path: Path) -> None:
    """Nothing listens at the agent's URL: nothing is dispatched; the run is marked
    failed_to_start (a plain rerun is allowed), the trainer raises the same LaunchError."""
    urls = {"agent": [dead_url()]}
    started = time.monotonic()
    if mode == "trainer":
        async with RolloutClient(urls["agent"]) as client:
            with pytest.raises(LaunchError, match=r"agent at http://127\.0\.0\.1"):
                await client.collect([task_row(0)])
    else:
        with pytest.raises(LaunchError, match=r"agent at http://127\.0\.0\.1"):
            await collect_run(mode, tmp_path, urls, 3)
        out = tmp_path / "out"
        run_info = orjson.loads((out / "run.json").read_bytes())
        assert run_info["status"] == "failed_to_start"
        assert run_info["error"]["type"] == "launch_error"
        assert not failures_of(out) and not (out / "rollouts.jsonl").exists()
        # Marked as never started: the same directory takes a new run at once.
        with pytest.raises(LaunchError):
            await collect_run(mode, tmp_path, urls, 3)
    assert time.monotonic() - started < 30
