"""Resume edge cases: a resume that died early, a run that never started."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from rollgym.collect import mark_failed_to_start, prepare_run
from rollgym.collect.ledger import Ledger
from rollgym.errors import ConfigError, LaunchError
from tests.support.stack import stack_config, write_tasks


def test_a_resume_killed_before_recording_keeps_the_attempt_count(tmp_path: Path) -> None:
    # The first resume moved the failure (2 attempts) to the history file, then died before
    # recording anything: the next resume must continue from 2, not from 0.
    (tmp_path / "failures.history.jsonl").write_bytes(
        orjson.dumps({"task_index": 0, "rollout_index": 1, "attempts": 2, "error": {}}) + b"\n"
    )
    ledger = Ledger(tmp_path, total=4, repeats=2)
    ledger.load(max_attempts=3)
    assert ledger.attempts_so_far(0, 1) == 2
    assert ledger.attempts_so_far(1, 0) == 0
    assert ledger.pending == 4


def test_a_run_that_failed_to_start_says_so_and_can_start_afresh(tmp_path: Path) -> None:
    cfg = stack_config()
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "out"
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    mark_failed_to_start(prepared, LaunchError("server agent exited with code 3", server="agent"))
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed_to_start" and run["exit_code"] == 2
    assert run["error"]["type"] == "launch_error"
    # Nothing was recorded, so the same directory takes a new run without --resume...
    again = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    assert again.total == 3
    # ...but not once the run has records.
    (out / "rollouts.jsonl").write_bytes(b"")
    with pytest.raises(ConfigError, match="holds an earlier run"):
        prepare_run(cfg, cfg.collect, tasks, out, resume=False)
