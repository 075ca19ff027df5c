"""A recorded run's files as replay reads them: a malformed line in the middle of a ledger or of
``tasks.jsonl`` is an error naming the file and the line, never a rollout silently left out of
the report; a torn last line (a run still writing, or killed mid-write) is skipped; CRLF line
ends read as the records they are."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import orjson
import pytest

from rollgym.errors import ConfigError
from rollgym.replay import replay
from tests.replay.support import record, script_row, write_config, write_rows

pytestmark = pytest.mark.timeout(180)

ENV = "tests.replay.envs:NondetEnv"


def _recorded(tmp_path: Path) -> Path:
    tasks = write_rows(tmp_path / "tasks.jsonl", [script_row(["stable"]) for _ in range(3)])
    cfg = write_config(tmp_path / "config.yaml", ENV)
    source = tmp_path / "run"
    assert asyncio.run(record(cfg, tasks, source)).status == "completed"
    return source


def _spoil_line(path: Path, lineno: int, with_text: bytes) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[lineno - 1] = with_text
    path.write_bytes(b"".join(lines))


def test_a_malformed_line_is_named_and_a_torn_last_line_skipped(tmp_path: Path) -> None:
    source = _recorded(tmp_path)
    rollouts = source / "rollouts.jsonl"
    good = rollouts.read_bytes()
    assert len(good.splitlines()) == 3

    # A middle line that is no record: without the error, its rollout would just be missing
    # from replay.json (replayed 2, all identical, exit 0).
    _spoil_line(rollouts, 2, b'{"task_index": 1, "rollout_index": 0, "respo\n')
    with pytest.raises(ConfigError, match=re.escape(f"{rollouts}:2: not JSON")):
        asyncio.run(replay(source, tmp_path / "bad", progress=False))
    assert not (tmp_path / "bad" / "replay.json").exists()

    tasks = source / "tasks.jsonl"
    rows = tasks.read_bytes()
    rollouts.write_bytes(good)
    _spoil_line(tasks, 3, b"[1, 2]\n")
    with pytest.raises(ConfigError, match=re.escape(f"{tasks}:3: a JSON list, not an object")):
        asyncio.run(replay(source, tmp_path / "bad_tasks", progress=False))
    tasks.write_bytes(rows)

    # CRLF line ends, and a torn last line of a run killed mid-write: what is whole replays.
    rollouts.write_bytes(good.replace(b"\n", b"\r\n") + b'{"task_index": 2, "rollout_ind')
    _, report = asyncio.run(replay(source, tmp_path / "ok", progress=False))
    saved = orjson.loads((tmp_path / "ok" / "replay.json").read_bytes())
    assert (saved["replayed"], saved["identical"]) == (3, 3)
    assert [e.rollout for e in report.entries()] == ["0:0", "1:0", "2:0"]


def test_a_replay_of_a_relative_run_dir_names_its_parent_by_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each replayed record names the run it replays (``rollgym_parent.run``), and the report
    its ``source``: a path relative to wherever the command was typed could not be followed
    from anywhere else."""
    source = _recorded(tmp_path)
    monkeypatch.chdir(tmp_path)
    _, report = asyncio.run(replay(Path("run"), Path("out"), rollouts="1:0", progress=False))
    assert report.source == str(source)
    rows = [
        orjson.loads(line) for line in (tmp_path / "out" / "input.jsonl").read_bytes().splitlines()
    ]
    assert [row["rollgym_parent"]["run"] for row in rows] == [str(source)]
    saved = orjson.loads((tmp_path / "out" / "replay.json").read_bytes())
    assert saved["source"] == str(source) and saved["replayed"] == saved["identical"] == 1
