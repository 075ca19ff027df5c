"""A CPU-bound verifier stuck in an endless loop fails only its own rollout."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollgym.collect import EXIT_SOME_FAILED, Collector, prepare_run
from rollgym.config import RetryPolicy, parse_config
from rollgym.http import Target
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session, tool
from rollgym.testing import serve_server, spin


class StuckEnv(ResourcesServer):
    verify_timeout = 1.0

    @tool
    async def echo(self, session: Session, text: str) -> dict[str, Any]:
        """Echo."""
        return {"echo": text}

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        # "stuck" tasks spin for an hour: only the process pool's timeout can stop them.
        seconds = 3600.0 if task.get("stuck") else 0.0
        await self.run_cpu(spin, seconds)
        return 1.0 if task["expected_answer"] in output_text(response) else 0.0


@pytest.mark.timeout(60)
async def test_stuck_verifier_fails_only_its_rollout(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    with tasks.open("w") as fh:
        for i in range(12):
            script = [{"call": "echo", "arguments": {"text": f"v{i}"}}, {"say": "{tool_output}"}]
            fh.write(
                json.dumps(
                    {
                        "responses_create_params": {
                            "input": "go",
                            "metadata": {"rollgym_script": json.dumps(script)},
                        },
                        "expected_answer": f"v{i}",
                        "stuck": i == 5,
                    }
                )
                + "\n"
            )
    cfg = parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted"},
                "env": {
                    "kind": "resources",
                    "impl": "tests.reliability.test_stuck_verifier:StuckEnv",
                },
                "agent": {
                    "kind": "agent",
                    "impl": "tool_agent",
                    "options": {"model": "model", "resources": "env"},
                },
            },
            "collect": {"concurrency": 4},
        }
    )
    policy = RetryPolicy(max_attempts=1)
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_server(StuckEnv, name="env", retry={"max_attempts": 1}) as (env_url, _),
        serve_server(
            "tool_agent",
            name="agent",
            options={"model": "model", "resources": "env"},
            peers={
                "model": Target.single("model", model_url, policy),
                "env": Target.single("env", env_url, cfg.servers["env"].retry),
            },
        ) as (agent_url, _),
    ):
        prepared = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        started = time.monotonic()
        outcome = await Collector(prepared, {"agent": [agent_url]}, progress=False).execute()
        elapsed = time.monotonic() - started
    assert outcome.exit_code == EXIT_SOME_FAILED
    assert outcome.metrics["counts"] == {"total": 12, "succeeded": 11, "failed": 1, "pending": 0}
    assert outcome.metrics["failures"]["by_type"] == {"deadline_exceeded": 1}
    failure = json.loads((tmp_path / "out" / "failures.jsonl").read_text())
    assert failure["task_index"] == 5
    assert elapsed < 30  # one verify timeout (1 s) plus pool restarts, not an hour


@pytest.mark.timeout(60)
async def test_pool_workers_die_with_their_server(tmp_path: Path) -> None:
    """SIGKILL of a resources server busy in a stuck verifier leaves no pool worker behind."""
    import asyncio
    import signal

    import aiohttp
    import psutil

    from rollgym.launch import Supervisor

    cfg = parse_config(
        {
            "servers": {
                "env": {
                    "kind": "resources",
                    "impl": "tests.reliability.test_stuck_verifier:StuckEnv",
                    "retry": {"max_attempts": 1},
                }
            }
        }
    )
    supervisor = Supervisor(cfg, log_dir=tmp_path / "logs")
    urls = await supervisor.start()
    try:
        proc = psutil.Process(supervisor.pids()[0])
        task = {"responses_create_params": {"input": "x"}, "expected_answer": "x", "stuck": True}
        response = {"output": []}
        async with aiohttp.ClientSession() as http:
            request = asyncio.create_task(
                http.post(urls["env"][0] + "/verify", json={**task, "response": response})
            )
            workers: list[psutil.Process] = []
            async with asyncio.timeout(30):  # until a worker is spinning in the stuck verify
                while not any(w.status() == psutil.STATUS_RUNNING for w in workers):
                    await asyncio.sleep(0.1)
                    workers = [
                        w
                        for w in proc.children(recursive=True)
                        if "spawn_main" in " ".join(w.cmdline())
                    ]
            proc.send_signal(signal.SIGKILL)
            _, alive = psutil.wait_procs(workers, timeout=10)
            assert not alive, f"orphaned pool workers: {[p.pid for p in alive]}"
            request.cancel()
    finally:
        await supervisor.stop()
