"""``rollgym run TASKS_DIR`` with no config, as ``harbor run -p`` does: every bundled task's
solve.sh scores 1.0 (``--agent oracle``), doing nothing scores 0 (``--agent nop``), recorded
in the same ledger as every other environment; a bad task directory fails before anything
runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from rollgym.harbor.probes import PROBES
from tests.harbor.conftest import BUNDLED, needs_podman

REPO = Path(__file__).resolve().parents[2]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
_PATH = (os.environ.get("PYTHONPATH"), str(REPO))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in _PATH if p), "COLUMNS": "1000"}


def start(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ROLLGYM, *map(str, args)], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def records(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@needs_podman
@pytest.mark.timeout(400)
def test_oracle_scores_one_and_nop_zero_on_every_bundled_task(tmp_path: Path) -> None:
    runs = {
        agent: (tmp_path / agent, start("run", BUNDLED, "--agent", agent, "-o", tmp_path / agent,
                                        "--no-progress"))
        for agent in ("oracle", "nop")
    }  # fmt: skip
    for agent, (out, proc) in runs.items():
        printed, _ = proc.communicate(timeout=380)
        assert proc.returncode == 0, f"{agent}: {printed[-3000:]}"
        done = records(out / "rollouts.jsonl")
        assert records(out / "failures.jsonl") == []
        assert len(done) == len(records(out / "tasks.jsonl")) >= 10
        want = 1.0 if agent == "oracle" else 0.0
        rewards = {r["harbor_task"]: r["reward"] for r in done}
        assert set(rewards.values()) == {want}, rewards
        assert not any(r["integrity_suspect"] for r in done)
        metrics = orjson.loads((out / "metrics.json").read_bytes())
        assert metrics["reward"]["mean"] == want


def test_a_bad_task_directory_fails_before_anything_runs(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(BUNDLED / "hello-file", tasks / "hello-file")
    (tasks / "hello-file" / "task.toml").write_text("[agent]\ntimeout_sec = 'soon'\n")
    done = subprocess.run(
        [ROLLGYM, "run", str(tasks), "-o", str(tmp_path / "out")], env=ENV, capture_output=True,
        text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2
    assert "task.toml" in done.stderr and "agent.timeout_sec" in done.stderr, done.stderr
    assert not (tmp_path / "out" / "rollouts.jsonl").exists()
    usage = subprocess.run(
        [ROLLGYM, "run", str(BUNDLED), "--agent", "terminal", "-o", str(tmp_path / "t")],
        env=ENV, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert usage.returncode == 2 and "--model-url" in usage.stderr


@needs_podman
@pytest.mark.timeout(300)
def test_audit_of_a_task_directory_runs_every_probe(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(BUNDLED / "fix-failing-test", tasks / "fix-failing-test")
    done = subprocess.run(
        [ROLLGYM, "audit", str(tasks), "--output", str(tmp_path / "audit")], env=ENV,
        capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    report = orjson.loads((tmp_path / "audit" / "audit.json").read_bytes())
    audit = report["servers"]["tasks"]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert audit["verdict"] == "clean" and audit["plays"] == len(PROBES), audit


@needs_podman
@pytest.mark.timeout(200)
def test_the_terminal_agent_runs_a_model_given_by_url(tmp_path: Path) -> None:
    from rollgym.testing import in_thread, serve_server

    tasks = tmp_path / "tasks"
    shutil.copytree(BUNDLED / "hello-file", tasks / "hello-file")
    # The scripted stand-in (no language model): with no script it calls the first tool once
    # with the instruction as its argument, then says the output. The path is what is tested:
    # model URL -> openai_proxy -> tool_agent -> harbor tools -> verify.
    with in_thread(serve_server("scripted", name="upstream")) as (url, _):
        done = subprocess.run(
            [ROLLGYM, "run", str(tasks), "--agent", "terminal", "--model-url", f"{url}/v1",
             "-o", str(tmp_path / "out"), "--no-progress"],
            env=ENV, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (record,) = records(tmp_path / "out" / "rollouts.jsonl")
    assert record["reward"] == 0.0 and record["harbor_task"] == "hello-file"
    calls = [i for i in record["response"]["output"] if i["type"] == "function_call"]  # type: ignore[index]
    assert calls and calls[0]["name"] in {"run_command", "read_file", "write_file", "edit_file"}
