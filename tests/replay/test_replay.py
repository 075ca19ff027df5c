"""``rollgym replay``: recorded rollouts run again with the model served from the record, and
nondeterminism located to its turn and field."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from rollgym.config import parse_config
from rollgym.errors import ConfigError
from rollgym.replay import first_divergence, replay, replay_config
from rollgym.replay.plan import select
from rollgym.reverify.source import RecordedRun
from tests.replay.support import record, script_row, write_config, write_rows

pytestmark = pytest.mark.timeout(180)

ENV = "tests.replay.envs:NondetEnv"
KINDS = ("clock", "draw", "members")


def _jsonl(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _cases(seed: int, n: int) -> list[tuple[list[str], int]]:
    """Seeded cases: 1 to 4 tool turns, one of which (``turn``) is nondeterministic."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        turns = rng.randint(1, 4)
        turn = rng.randrange(turns)
        calls = ["stable"] * turns
        calls[turn] = rng.choice(KINDS)
        out.append((calls, turn))
    return out


def test_nondeterminism_is_located_to_its_turn(tmp_path: Path) -> None:
    cases = _cases(seed=41, n=36)
    stable_rows = [script_row(["stable"] * 2) for _ in range(4)]
    tasks = write_rows(tmp_path / "tasks.jsonl", [script_row(c) for c, _ in cases] + stable_rows)
    cfg = write_config(tmp_path / "config.yaml", ENV)
    source = tmp_path / "run"
    assert asyncio.run(record(cfg, tasks, source)).status == "completed"

    out = tmp_path / "replayed"
    _, report = asyncio.run(replay(source, out, progress=False))

    entries = {r.rollout: r for r in report.entries()}
    assert len(entries) == len(cases) + len(stable_rows)
    located = 0
    for i, (_, turn) in enumerate(cases):
        d = entries[f"{i}:0"].divergence
        if d is not None and d.turn == turn and d.field == "tool output":
            located += 1
    assert located / len(cases) >= 0.95, (located, len(cases))
    # The deterministic rollouts replay identically, tool outputs, reward and fields.
    for i in range(len(cases), len(cases) + len(stable_rows)):
        assert entries[f"{i}:0"].status == "identical"
    saved = orjson.loads((out / "replay.json").read_bytes())
    # A set's order may come out the same twice by chance (the 95% above allows it): such a
    # case reads identical, never a stable row diverged.
    missed = len(cases) - located
    assert len(stable_rows) <= saved["identical"] <= len(stable_rows) + missed
    assert saved["identical"] + saved["diverged"] == len(cases) + len(stable_rows)
    first = next(r for r in saved["rollouts"] if r["status"] == "diverged")
    assert first["divergence"]["recorded"] != first["divergence"]["replayed"]
    assert saved["environment"]["fingerprints"] in ("unknown", "same")
    # Every replayed record names the rollout it replays.
    parents = {r["rollgym_parent"]["rollout"] for r in _jsonl(out / "rollouts.jsonl")}
    assert parents == set(entries)


VERIFIER = '''
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session, tool


class EditedEnv(ResourcesServer):
    row_fields = frozenset({{"expected_answer"}})

    @tool
    async def stable(self, session: Session, key: str) -> dict:
        """A pure function of its argument."""
        return {{"key": key}}

    async def verify(self, session: Session, task: dict, response: dict) -> dict:
        matched = 1.0 if task["expected_answer"] in output_text(response) else 0.0
        return {{"reward": {reward}, "matched": matched}}
'''


def test_an_edited_verifier_is_located_at_the_verify(tmp_path: Path) -> None:
    module = tmp_path / "edited_env.py"
    module.write_text(VERIFIER.format(reward="matched"))
    rng = random.Random(5)
    turns = [rng.randint(0, 3) for _ in range(10)]
    tasks = write_rows(tmp_path / "tasks.jsonl", [script_row(["stable"] * n) for n in turns])
    cfg = write_config(tmp_path / "config.yaml", "edited_env:EditedEnv")
    source = tmp_path / "run"
    assert asyncio.run(record(cfg, tasks, source)).status == "completed"

    module.write_text(VERIFIER.format(reward="1.0 - matched"))  # edited between the two
    _, report = asyncio.run(replay(source, tmp_path / "replayed", progress=False))

    got = list(report.entries())
    assert report.diverged == len(got) == len(turns)
    for i, n in enumerate(turns):
        d = got[i].divergence
        assert d is not None and d.field == "reward", got[i]
        assert d.turn == n + 1  # after the last of its n tool turns and its answer
        assert d.recorded == 1.0 - d.replayed
    env = report.environment
    assert env["differs"] and env["code"] == "differs"
    assert any("env" in line for line in env["code_changes"])


def test_bundled_environment_replays_identically_and_a_fork_keeps_its_prefix(
    tmp_path: Path,
) -> None:
    root = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs"
    rows = [
        orjson.loads(line)
        for line in (root / "lookup/data/example.jsonl").read_bytes().splitlines()[:6]
    ]
    tasks = write_rows(tmp_path / "tasks.jsonl", rows)
    cfg = write_config(tmp_path / "config.yaml", "lookup", repeats=3)
    source = tmp_path / "run"
    assert asyncio.run(record(cfg, tasks, source)).status == "completed"
    recorded = {(r["task_index"], r["rollout_index"]): r for r in _jsonl(source / "rollouts.jsonl")}

    _, report = asyncio.run(replay(source, tmp_path / "same", progress=False))
    assert report.identical == len(recorded) == 18 and not report.diverged

    # A fork at turn 1: turn 0 (the lookup and its answer) exactly as recorded, turn 1 from
    # the live (scripted) model; the new rollout names its parent and K.
    out = tmp_path / "fork"
    _, forked = asyncio.run(
        replay(source, out, config=cfg, rollouts="0:1,2:0", fork_at=1, progress=False)
    )
    assert [r.status for r in forked.entries()] == ["identical", "identical"]
    news = {r["rollgym_parent"]["rollout"]: r for r in _jsonl(out / "rollouts.jsonl")}
    assert set(news) == {"0:1", "2:0"}
    for parent, new in news.items():
        assert new["rollgym_parent"]["fork_at"] == 1
        old = recorded[tuple(int(x) for x in parent.split(":"))]  # type: ignore[index]
        assert first_divergence(old, new, turns=1) is None
        old_ids = {i.get("id") for i in old["response"]["output"]}
        live = [i for i in new["response"]["output"] if i.get("type") == "message"]
        assert live and all(i["id"] not in old_ids for i in live)  # answered by the live model


def test_usage_errors(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "rollgym", "replay"]
    missing = subprocess.run(
        [*cli, str(tmp_path / "nope"), "--output", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "no such run directory" in missing.stderr
    forked = subprocess.run(
        [*cli, str(tmp_path), "--output", str(tmp_path / "o"), "--fork-at", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert forked.returncode == 2
    url_agent = parse_config(
        {"servers": {
            "model": {"kind": "model", "impl": "scripted"},
            "env": {"kind": "resources", "impl": "echo"},
            "agent": {"kind": "agent", "url": "http://127.0.0.1:9", "options": {"model": "model"}},
        }}, "cfg.yaml",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"servers.agent.url"):
        replay_config(url_agent, tmp_path / "p", tmp_path / "l")
    shared = parse_config(
        {"servers": {
            "model": {"kind": "model", "impl": "scripted"},
            "judge": {"kind": "resources", "impl": "judge", "options": {"judge": "model"}},
            "agent": {"kind": "agent", "impl": "tool_agent",
                      "options": {"model": "model", "resources": "judge"}},
        }}, "cfg.yaml",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"servers.judge.options names model server 'model'"):
        replay_config(shared, tmp_path / "p", tmp_path / "l")


def test_a_turn_the_record_lacks_is_a_divergence_not_a_hang(tmp_path: Path) -> None:
    tasks = write_rows(tmp_path / "tasks.jsonl", [script_row(["stable", "stable"])] * 2)
    short = write_config(tmp_path / "short.yaml", ENV)
    short.servers["agent"].options["max_steps"] = 1  # recorded: one turn, truncated
    source = tmp_path / "run"
    assert asyncio.run(record(short, tasks, source)).status == "completed"
    with pytest.raises(ConfigError, match="has no rollout 9:0"):
        asyncio.run(replay(source, tmp_path / "x", rollouts="0:0,9:0", progress=False))
    with pytest.raises(ConfigError, match="give one of them"):
        asyncio.run(replay(source, tmp_path / "x", rollouts="0:0", sample=1, progress=False))
    run = RecordedRun(source)
    try:
        drawn = [select(run, source, None, 1, seed) for seed in range(8)]
        assert all(len(d) == 1 for d in drawn) and drawn == [
            select(run, source, None, 1, s) for s in range(8)
        ]
        assert {d[0] for d in drawn} == {(0, 0), (1, 0)}  # seeded, and both get drawn
        assert select(run, source, None, 5) == [(0, 0), (1, 0)]
    finally:
        run.close()

    longer = write_config(tmp_path / "long.yaml", ENV)  # max_steps 8: it asks for turn 1
    out = tmp_path / "replayed"
    _, report = asyncio.run(replay(source, out, config=longer, progress=False))
    for got in report.entries():
        d = got.divergence
        assert d is not None and (d.turn, d.field) == (1, "replay model"), got
        assert "the record has 1 model turns" in str(d.replayed)
    # The CLI says so with exit code 1, and its table names the field.
    again = subprocess.run(
        [sys.executable, "-m", "rollgym", "replay", str(source), "--output",
         str(tmp_path / "cli"), "--config", str(tmp_path / "long.yaml"), "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 1, again.stderr
    assert "replay model" in again.stdout and "0 of 2 identical" in again.stdout
