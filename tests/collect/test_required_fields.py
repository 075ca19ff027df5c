"""A row without a field its environment requires (``required_row_fields``) is refused before
anything is dispatched, naming the file, the line and the field; the command-line runs start
real server processes on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from rollgym.envs.lookup.server import LookupEnv
from rollgym.envs.math.server import MathEnv
from rollgym.envs.mcqa.server import MCQAEnv

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
LOOKUP = REPO / "src" / "rollgym" / "envs" / "lookup" / "config.yaml"
ROWS = LOOKUP.parent / "data" / "example.jsonl"


def rollgym(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLGYM, *map(str, args)], capture_output=True, text=True, timeout=90,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip


def test_bundled_environments_require_what_their_verify_refuses_without() -> None:
    for env in (LookupEnv, MathEnv, MCQAEnv):
        assert env.required_row_fields == {"expected_answer"}
        assert env.row_fields is not None and env.required_row_fields <= env.row_fields


def test_a_row_without_a_required_field_is_refused_before_any_rollout(tmp_path: Path) -> None:
    rows = [orjson.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    for i in (2, 4):  # lines 3 and 5 of the file
        del rows[i]["expected_answer"]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "out"
    done = rollgym("run", LOOKUP, "-i", tasks, "-o", out, "--no-progress")
    assert done.returncode == 2, done.stderr
    assert f"{tasks}:3: no 'expected_answer' (server lookup needs it)" in done.stderr
    assert f"{tasks}:5: no 'expected_answer'" in done.stderr
    assert "2 row(s) lack a field" in done.stderr and "Traceback" not in done.stderr
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "failed_to_start"
    assert not (out / "rollouts.jsonl").exists() or not (out / "rollouts.jsonl").read_bytes()

    # The same file with the rows fixed runs.
    tasks.write_bytes(ROWS.read_bytes())
    fixed = rollgym("run", LOOKUP, "-i", tasks, "-o", tmp_path / "fixed", "--no-progress")
    assert fixed.returncode == 0, fixed.stderr
