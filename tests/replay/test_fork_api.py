"""The trainer API's ``fork``: several continuations of one recorded rollout from its turn k."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

import rollgym
from rollgym.replay import first_divergence
from tests.replay.support import record, write_config, write_rows

pytestmark = pytest.mark.timeout(120)


def test_fork_continues_a_record_from_turn_k(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs" / "lookup"
    rows = [
        orjson.loads(line) for line in (root / "data/example.jsonl").read_bytes().splitlines()[:2]
    ]
    cfg = write_config(tmp_path / "config.yaml", "lookup")
    source = tmp_path / "run"
    asyncio.run(record(cfg, write_rows(tmp_path / "tasks.jsonl", rows), source))
    parent = orjson.loads((source / "rollouts.jsonl").read_bytes().splitlines()[0])

    forks, report = asyncio.run(rollgym.fork(parent, 1, config=cfg, n=2))

    assert len(forks) == 2 and all(r.status == "identical" for r in report.entries())
    for new in forks:
        assert new["rollgym_parent"]["fork_at"] == 1
        assert first_divergence(parent, new, turns=1) is None
    with pytest.raises(rollgym.ConfigError, match="no 'response'"):
        asyncio.run(rollgym.fork({"reward": 1.0}, 1, config=cfg))
