"""Replay through the other agents: the OpenEnv agent (an OpenEnv environment served by
openenv-core's own server) beside the tool agent, from the mixed example's config; the
Gymnasium agent (the guess environment)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import orjson
import pytest
import yaml

from rollgym.config import load_config
from rollgym.replay import replay
from tests.replay.support import record

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


def test_openenv_and_tool_agents_replay_identically(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    shutil.copytree(
        ROOT / "examples" / "mixed", folder, ignore=shutil.ignore_patterns("__pycache__")
    )
    config = yaml.safe_load((folder / "config.yaml").read_text())
    for name in ("nemo_tool_call", "nemo_agent", "reasoning_gym", "rg_agent"):
        del config["servers"][name]
    config["collect"]["agent"] = "lookup_agent"
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    rows = [orjson.loads(line) for line in (folder / "tasks.jsonl").read_bytes().splitlines()]
    kept = [
        r
        for r in rows
        if (r.get("agent_ref") or {}).get("name") in ("openenv_agent", "lookup_agent")
    ]
    (folder / "tasks.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in kept))
    cfg = load_config(folder / "config.yaml")
    source = tmp_path / "run"
    assert asyncio.run(record(cfg, folder / "tasks.jsonl", source)).status == "completed"

    _, report = asyncio.run(replay(source, tmp_path / "replayed", progress=False))
    recorded = [orjson.loads(x) for x in (source / "rollouts.jsonl").read_bytes().splitlines()]
    assert any("openenv_reset" in r for r in recorded)  # the OpenEnv agent's rollouts are there
    assert report.identical == len(recorded) == len(kept) * 4 and not report.diverged


def test_gymnasium_agent_replays_identically(tmp_path: Path) -> None:
    folder = ROOT / "src" / "rollgym" / "envs" / "guess"
    cfg = load_config(folder / "config.yaml")
    cfg = cfg.model_copy(update={"collect": cfg.collect.model_copy(update={"repeats": 2})})
    source = tmp_path / "run"
    assert asyncio.run(record(cfg, folder / "data" / "example.jsonl", source)).status == "completed"
    _, report = asyncio.run(replay(source, tmp_path / "replayed", progress=False))
    assert report.identical == report.replayed == len(list(report.entries())) == 12
