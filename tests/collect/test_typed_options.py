"""The collector and ``reverify`` read a server's typed options, defaults included: an agent
that relies on the default ``resources: resources`` gets its environment's metrics under both."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import RunningServers, run_collection
from rollgym.collect.peers import peers_of, resources_of
from rollgym.config import Config, parse_config
from rollgym.envs.echo.server import EchoEnv
from rollgym.http import Target
from rollgym.reverify import reverify
from rollgym.testing import serve_server
from tests.compat.stack import FAST, echo_row, policy, write_rows

pytestmark = pytest.mark.timeout(120)


class ScoredEcho(EchoEnv):
    """Echo with metrics of its own over the run (server processes import it from here)."""

    row_fields = frozenset({"expected_answer"})

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        rewards = [r["reward"] for r in rollouts]
        return {"hit_rate": sum(rewards) / len(rewards)} if rewards else {}


def _config() -> Config:
    """The agent names its model only: it verifies with the server its options default to."""
    return parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted", "retry": FAST},
                "resources": {"kind": "resources", "impl": f"{__name__}:ScoredEcho",
                              "retry": FAST},
                "agent": {"kind": "agent", "impl": "tool_agent", "options": {"model": "model"}},
            },
            "collect": {"concurrency": 4, "rollout_timeout": 30},
        },
        "defaults.yaml",
    )  # fmt: skip


def test_the_defaults_of_the_typed_options_are_read() -> None:
    cfg = _config()
    assert resources_of(cfg, "agent") == "resources"
    assert peers_of(cfg, "agent") == {"model", "resources"}
    assert peers_of(cfg, "resources") == set()


async def _run(cfg: Config, rows: Path, out: Path) -> None:
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_server(ScoredEcho, name="resources") as (env_url, _),
    ):
        peers = {
            "model": Target.single("model", model_url, policy("model")),
            "resources": Target.single("resources", env_url, policy("resources")),
        }
        async with serve_server(
            "tool_agent", name="agent", options={"model": "model"}, peers=peers
        ) as (agent_url, _):
            urls = {"model": [model_url], "resources": [env_url], "agent": [agent_url]}
            outcome = await run_collection(
                cfg, cfg.collect, rows, out, RunningServers(urls), progress=False
            )
    assert outcome.exit_code == 0


def test_an_agent_on_the_default_resources_gets_env_metrics_under_run_and_reverify(
    tmp_path: Path,
) -> None:
    cfg = _config()
    rows = write_rows(tmp_path / "tasks.jsonl", [echo_row(i) for i in range(3)])
    source = tmp_path / "run"
    asyncio.run(_run(cfg, rows, source))
    metrics = orjson.loads((source / "metrics.json").read_bytes())
    assert metrics["env_aggregate"]["key_metrics"] == {"hit_rate": 1.0}

    out = tmp_path / "reverified"
    outcome, _ = asyncio.run(reverify(cfg, cfg.collect, source, out, progress=False))
    assert outcome.exit_code == 0
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    assert metrics["env_aggregate"]["key_metrics"] == {"hit_rate": 1.0}
