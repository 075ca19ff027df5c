"""Run-directory field reports, through the real ``rollgym`` command: ``--servers`` and
``--output`` checked before anything is written, Ctrl-C during start-up, a live run told from a
dead one, ``--resume`` reusing the run's own inputs, and ``impl:`` modules beside the config."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
import yaml

from rollgym.collect.rundir import DIED, read_state
from tests.support.ledger import assert_ledger_invariant, read_jsonl
from tests.support.procs import still_alive
from tests.support.stack import stack_data, write_tasks
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
FAULTY_MODEL = "tests.support.servers:FaultyModel"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"}


def rollgym(
    *args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLGYM, *map(str, args)], env=env or ENV, cwd=cwd, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def write_config(
    path: Path, *, collect: dict[str, Any] | None = None, **model_options: Any
) -> Path:
    model = {"impl": FAULTY_MODEL, "options": model_options}
    path.write_text(yaml.safe_dump(stack_data({"concurrency": 2, **(collect or {})}, model=model)))
    return path


def run_json(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((out / "run.json").read_bytes())
    return data


# -- checked before anything is written --------------------------------------------------------


def test_collect_refuses_servers_that_are_not_urls(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    listed = tmp_path / "urls.json"
    listed.write_bytes(orjson.dumps({"agent": ["http://127.0.0.1:1", "localhost:8000"]}))
    cases = [
        ("agent=notaurl", "--servers agent=notaurl: 'notaurl' is not an http(s) URL"),
        ("agent=http://127.0.0.1:99999", "--servers agent=http://127.0.0.1:99999: "),
        (str(listed), f"--servers {listed}: agent: 'localhost:8000' is not an http(s) URL"),
        ("http://127.0.0.1:8000", "name the server it is, as NAME=URL"),
    ]
    for value, message in cases:
        out = tmp_path / "out"
        done = rollgym("collect", cfg, "-i", tasks, "-o", out, "--servers", value)
        assert done.returncode == 2, (value, done.stderr)
        assert message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not out.exists(), value  # refused before the run directory was made


def test_a_config_url_that_is_not_a_url_names_the_file_and_key(tmp_path: Path) -> None:
    data = stack_data()
    data["servers"]["agent"] = {"kind": "agent", "url": "127.0.0.1:8000"}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    done = rollgym("collect", cfg, "-i", tasks, "-o", tmp_path / "out")
    assert done.returncode == 2, done.stderr
    assert f"{cfg}: servers.agent.url: '127.0.0.1:8000' is not an http(s) URL" in done.stderr


def test_an_output_that_cannot_be_a_directory_is_a_clear_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    cases = [
        (a_file, "is a file, not a directory"),
        (a_file / "out", f"{a_file} is a file, so no directory can be made under it"),
        # Cannot be created, even by root: /proc takes no new directories.
        (Path("/proc/self/rollgym-out"), "cannot write the run there"),
    ]
    for out, message in cases:
        done = rollgym("run", cfg, "-i", tasks, "-o", out, "--no-progress")
        assert done.returncode == 2, (out, done.stderr)  # not 1: nothing "completed"
        assert f"--output {out}: " in done.stderr and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert a_file.read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_an_output_without_write_permission_is_a_clear_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    done = rollgym("run", cfg, "-i", tasks, "-o", locked, "--no-progress")
    assert done.returncode == 2, done.stderr
    assert f"--output {locked}: cannot write the run there (Permission denied)" in done.stderr


# -- Ctrl-C during start-up ----------------------------------------------------------------------

SLOW_ENV = '''
import asyncio
import signal

from rollgym.envs.echo.server import EchoEnv


class NeverReady(EchoEnv):
    """Never finishes starting: the run waits for its health until interrupted."""

    async def startup(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # stop at once, not after the grace
        await asyncio.sleep(3600)
'''


def test_ctrl_c_during_startup_says_so_and_marks_the_run(tmp_path: Path) -> None:
    (tmp_path / "never_ready.py").write_text(SLOW_ENV)
    data = stack_data(env={"impl": "never_ready:NeverReady"})
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "out"
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    proc = subprocess.Popen(
        [ROLLGYM, "run", str(cfg), "-i", str(tasks), "-o", str(out), "--no-progress"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        logs = out / "logs"
        wait_for(lambda: logs.exists() and len(list(logs.iterdir())) == 3, 30, "servers spawned")
        servers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert run_json(out)["status"] == "running"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 2, stderr
    assert "error: interrupted by SIGINT during start-up; nothing was dispatched" in stderr
    assert "Traceback" not in stderr
    run = run_json(out)
    assert run["status"] == "failed_to_start" and run["exit_code"] == 2
    assert "interrupted by SIGINT" in run["error"]["message"]
    assert still_alive(servers, timeout=5) == []
    state = read_state(out)
    assert state is not None and state.status == "failed_to_start" and not state.alive


# -- a live run, a dead run ---------------------------------------------------------------------


@contextmanager
def collecting(args: list[str | Path], out: Path) -> Iterator[subprocess.Popen[str]]:
    """``rollgym *args`` in the background once it has recorded 2 rollouts; killed after."""
    proc = subprocess.Popen(
        [ROLLGYM, *map(str, args)], env=ENV, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        recorded = out / "rollouts.jsonl"
        wait_for(lambda: recorded.exists() and recorded.read_bytes().count(b"\n") >= 2, 40, "2")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_live_run_is_not_resumed_and_a_killed_one_is_told_apart(tmp_path: Path) -> None:
    hold = tmp_path / "hold"  # while it exists, model calls wait: the run cannot end under us
    cfg = write_config(tmp_path / "cfg.yaml", latency=0.3, hold_while_exists=str(hold))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 60)
    out = tmp_path / "out"
    args: list[str | Path] = ["run", cfg, "-i", tasks, "-o", out, "--no-progress"]
    with collecting(args, out) as proc:
        # 60 rollouts two at a time take 9 s at least: far more than this takes, so the run is
        # still going; from now on it stays so, however slow the two commands below are.
        hold.touch()
        state = read_state(out)
        assert state is not None and state.alive and state.pid == proc.pid
        for extra in (["--resume"], []):
            done = rollgym(*args, *extra)
            assert done.returncode == 2, done.stderr
            assert f"{out}: a run is still collecting into it (pid {proc.pid} on " in done.stderr
            assert f"kill -INT {proc.pid}" in done.stderr
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    hold.unlink()
    assert run_json(out)["status"] == "running"  # what the dead run last wrote...
    state = read_state(out)
    assert state is not None and state.status == DIED and not state.alive  # ...and the truth

    done = rollgym(*args, "--resume")
    assert done.returncode == 0, done.stderr
    run = run_json(out)
    assert run["status"] == "completed" and run["process"]["pid"] != proc.pid
    assert [h["status"] for h in run["history"]] == [DIED]
    assert run["history"][0]["process"]["pid"] == proc.pid
    assert len(assert_ledger_invariant(out)[0]) == 60


# -- --resume reuses the run's own inputs -------------------------------------------------------


def test_resume_needs_no_input_repeats_or_limit_and_shows_the_current_state(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken"
    broken.touch()
    cfg = write_config(tmp_path / "cfg.yaml", fail_while_exists=str(broken))  # no collect.input
    tasks = write_tasks(tmp_path / "tasks.jsonl", 6)
    out = tmp_path / "out"
    first = rollgym(
        "run", cfg, "-i", tasks, "-o", out, "--repeats", "2", "--limit", "4",
        "--max-failures", "2", "--no-progress",
    )  # fmt: skip
    assert first.returncode == 2, first.stderr
    assert run_json(out)["status"] == "aborted"

    broken.unlink()  # the model is fixed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # from another directory: the recorded input path still holds
    done = rollgym("run", cfg, "-o", out, "--resume", "--no-progress", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    run = run_json(out)
    assert run["status"] == "completed" and run["exit_code"] == 0
    assert "abort" not in run  # the current state, not the last session's
    assert run["inputs"]["repeats"] == 2 and run["inputs"]["limit"] == 4
    [earlier] = run["history"]
    assert earlier["status"] == "aborted" and "2 rollouts failed" in earlier["abort"]["reason"]
    rollouts, failures = assert_ledger_invariant(out)
    assert len(rollouts) == 8 and failures == []
    assert len(read_jsonl(out / "tasks.jsonl")) == 8

    # Given explicitly, they must still match the run.
    done = rollgym("run", cfg, "-o", out, "--resume", "--repeats", "3", "--no-progress")
    assert done.returncode == 2 and "--repeats differs" in done.stderr


# -- impl: module:Class beside the config --------------------------------------------------------


def test_an_impl_module_beside_the_config_is_found(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "weather.py").write_text(
        "from rollgym.envs.echo.server import EchoEnv\n\n\nclass Weather(EchoEnv):\n    pass\n"
    )
    data = stack_data(env={"impl": "weather:Weather"})
    (project / "cfg.yaml").write_text(yaml.safe_dump(data))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    # From another directory, with nothing of the project on PYTHONPATH.
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    done = rollgym(
        "run", "project/cfg.yaml", "-i", tasks, "-o", tmp_path / "out", "--no-progress",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(assert_ledger_invariant(tmp_path / "out")[0]) == 3


def test_an_impl_that_cannot_be_imported_says_where_and_what_to_do(tmp_path: Path) -> None:
    data = stack_data(env={"impl": "wether:Weather"})
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "out"
    done = rollgym("run", cfg, "-i", tasks, "-o", out, "--no-progress")
    assert done.returncode == 2, done.stderr
    assert f"{cfg}: servers.env.impl: 'wether:Weather': no module named 'wether'" in done.stderr
    assert f"put wether.py (or the package wether/) beside the config ({tmp_path})" in done.stderr
    assert not out.exists()  # checked before the run directory was made
