"""A rollout whose agent refused the connection (nothing was sent) is recorded, but the refusal
does not use up its attempts: however many resumes ran against a dead agent, a resume against
the live one runs every such rollout."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import Collector, prepare_run
from rollgym.config import parse_config
from rollgym.http import Target
from rollgym.testing import serve_server

pytestmark = pytest.mark.timeout(60)


def _config() -> Any:
    return parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted"},
                "env": {"kind": "resources", "impl": "echo"},
                "agent": {"kind": "agent", "impl": "tool_agent",
                          "options": {"model": "model", "resources": "env"}},
            },
            "collect": {"max_rollout_attempts": 2, "max_failure_rate": None},
        },
        "unsent-test",
    )  # fmt: skip


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _row(i: int) -> dict[str, Any]:
    script = [{"call": "echo", "arguments": {"text": f"v{i}"}}, {"say": "It is {tool_output}"}]
    return {
        "responses_create_params": {"input": f"t{i}", "metadata": {"rollgym_script": script}},
        "expected_answer": f"v{i}",
    }


async def _collect(
    cfg: Any, tasks: Path, out: Path, urls: dict[str, list[str]], resume: bool
) -> Any:
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=resume)
    return await Collector(prepared, urls, progress=False).execute()


async def test_refused_connections_never_use_up_a_rollouts_attempts(tmp_path: Path) -> None:
    cfg = _config()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(_row(i)) + b"\n" for i in range(4)))
    out = tmp_path / "out"
    dead = {"agent": [_dead_url()]}
    for n in range(3):  # more runs than max_rollout_attempts
        outcome = await _collect(cfg, tasks, out, dead, resume=n > 0)
        assert outcome.metrics["counts"]["failed"] == 4
        failures = [orjson.loads(x) for x in (out / "failures.jsonl").read_bytes().splitlines()]
        assert {f["error"]["type"] for f in failures} == {"connect_error"}
        assert {f["attempts"] for f in failures} == {0}  # nothing reached the agent
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_server("echo", name="env") as (env_url, _),
    ):
        peers = {"model": Target.single("model", model_url), "env": Target.single("env", env_url)}
        async with serve_server(
            "tool_agent", name="agent", peers=peers, options={"model": "model", "resources": "env"}
        ) as (agent_url, _):
            outcome = await _collect(cfg, tasks, out, {"agent": [agent_url]}, resume=True)
    assert outcome.status == "completed", outcome.abort_reason
    assert outcome.metrics["counts"]["succeeded"] == 4
