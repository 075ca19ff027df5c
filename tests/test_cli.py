"""The ``rollgym`` command line for real: subprocesses that start real server processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
import typer
import yaml

from tests.support.ledger import assert_ledger_invariant, error_chain, keys, read_jsonl
from tests.support.procs import still_alive
from tests.support.servers import FAIL_MARKER, FAULT_MESSAGE
from tests.support.stack import stack_data, task_row, write_tasks
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[1]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
FAULTY_MODEL = "tests.support.servers:FaultyModel"
# The children import the test-only servers as ``tests.*``; a wide terminal keeps rich from
# wrapping error messages in the middle of a path.
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"}


def rollgym(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLGYM, *map(str, args)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def write_config(path: Path, **model_options: Any) -> Path:
    """The stack's config file, its model a ``FaultyModel`` with ``model_options``."""
    model = {"impl": FAULTY_MODEL, "options": model_options}
    path.write_text(yaml.safe_dump(stack_data({"concurrency": 4}, model=model)))
    return path


@contextmanager
def run_midway(
    args: list[str | Path], out: Path, *, capture: bool = False
) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """``rollgym *args`` in the background, yielded with its servers' pids once it has recorded
    4 rollouts in ``out``; killed on the way out if it still runs."""
    pipe = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.Popen(
        [ROLLGYM, *map(str, args)], env=ENV, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe,
        text=True,
    )  # fmt: skip
    try:
        recorded = out / "rollouts.jsonl"
        wait_for(
            lambda: recorded.exists() and recorded.read_bytes().count(b"\n") >= 4, 30, "records"
        )
        yield proc, [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """One real run with some rollouts failing 500: (config, tasks, output)."""
    tmp = tmp_path_factory.mktemp("cli-run")
    cfg = write_config(tmp / "cfg.yaml", fail_marker=FAIL_MARKER)
    tasks = write_tasks(tmp / "tasks.jsonl", 8, fail={1, 6})
    out = tmp / "out"
    done = rollgym("run", cfg, "-i", tasks, "-o", out, "--repeats", "2", "--no-progress")
    assert done.returncode == 1, done.stderr
    yield cfg, tasks, out


def test_run_records_failed_rollouts_and_completes_with_exit_code_1(
    finished_run: tuple[Path, Path, Path],
) -> None:
    _, _, out = finished_run
    rollouts, failures = assert_ledger_invariant(out)
    assert len(rollouts) == 12 and all(r["reward"] == 1.0 for r in rollouts)
    assert sorted(keys(failures)) == [(1, 0), (1, 1), (6, 0), (6, 1)]
    for rec in failures:
        chain = error_chain(rec["error"])
        model = next(e for e in chain if e["server"] == "model")
        assert model["status"] == 500 and model["attempts"] == 3
        assert FAULT_MESSAGE in model["message"]
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "completed_with_failures" and run["exit_code"] == 1
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    assert metrics["counts"]["failed"] == 4 and metrics["failures"]["by_server"] == {"model": 4}
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["agent.log", "env.log", "model.log"]


def test_resume_refuses_other_repeats_or_input_and_reuse_needs_resume(
    finished_run: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    cfg, tasks, out = finished_run
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    other = write_tasks(tmp_path / "other.jsonl", 9)
    cases = [
        (["-i", tasks, "--resume", "--repeats", "3"], "cannot resume: --repeats differs"),
        (["-i", other, "--resume", "--repeats", "2"], "the input file's content differs"),
        (["-i", tasks, "--repeats", "2"], "holds an earlier run"),
    ]
    for extra, message in cases:
        done = rollgym("run", cfg, "-o", out, "--no-progress", *extra)
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert message in done.stderr, done.stderr
        assert "resume" in done.stderr
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before  # a refused run touches nothing


def test_malformed_input_is_reported_by_file_and_line_and_nothing_is_dispatched(
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", request_log=str(tmp_path / "requests.log"))
    bad_json = write_tasks(tmp_path / "bad.jsonl", 2)
    with bad_json.open("ab") as fh:
        fh.write(b'{"responses_create_params": \n')
    no_params = tmp_path / "no_params.jsonl"
    no_params.write_bytes(
        orjson.dumps(task_row(0)) + b"\n" + orjson.dumps({"expected_answer": "x"}) + b"\n"
    )
    for path, where, why in [
        (bad_json, ":3:", "not valid JSON"),
        (no_params, ":2:", "missing required field 'responses_create_params'"),
    ]:
        out = tmp_path / f"out-{path.stem}"
        done = rollgym("run", cfg, "-i", path, "-o", out, "--no-progress")
        assert done.returncode == 2, done.stderr
        assert f"{path}{where} {why}" in done.stderr
        assert not out.exists()  # nothing was written, no server was started
    assert not (tmp_path / "requests.log").exists()  # no request reached the model


def test_a_killed_run_resumes_without_redoing_a_success_and_leaves_no_orphans(
    tmp_path: Path,
) -> None:
    requests = tmp_path / "requests.log"
    cfg = write_config(tmp_path / "cfg.yaml", latency=0.15, request_log=str(requests))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 30)
    out = tmp_path / "out"
    args = ["run", cfg, "-i", tasks, "-o", out, "--concurrency", "3", "--no-progress"]
    with run_midway(args, out) as (proc, servers):
        assert len(servers) == 3
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert still_alive(servers) == []  # the servers died with their collector

    recorded = out / "rollouts.jsonl"
    raw = recorded.read_bytes()
    before = raw[: raw.rfind(b"\n") + 1]  # the whole records; a torn tail is redone
    done_before = keys(read_jsonl(recorded))[: before.count(b"\n")]
    assert 4 <= len(done_before) < 30, "the run must be killed midway"

    done = rollgym("run", cfg, "-i", tasks, "-o", out, "--resume", "--no-progress")
    assert done.returncode == 0, done.stderr
    rollouts, failures = assert_ledger_invariant(out)
    assert failures == [] and len(rollouts) == 30
    assert recorded.read_bytes().startswith(before)  # recorded successes are unchanged
    assert len({r["response"]["id"] for r in rollouts}) == 30
    calls = Counter(requests.read_text().split())
    for task, rollout in done_before:
        assert calls[f"{task}:{rollout}"] == 2, "a recorded success was run again"
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "completed" and len(run["resumes"]) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_aborts_the_run_cleanly_and_resume_finishes_it(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # SIGTERM: what a scheduler sends before it kills; SIGINT: Ctrl-C.
    cfg = write_config(tmp_path / "cfg.yaml", latency=0.15)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 30)
    out = tmp_path / "out"
    args = ["run", cfg, "-i", tasks, "-o", out, "--concurrency", "3", "--no-progress"]
    with run_midway(args, out, capture=True) as (proc, servers):
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 2, stderr
    assert f"interrupted by {sig.name}" in stdout
    assert still_alive(servers, timeout=2) == []  # stopped by the run itself
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "aborted" and run["abort"]["reason"] == f"interrupted by {sig.name}"
    counts = orjson.loads((out / "metrics.json").read_bytes())["counts"]
    assert counts["pending"] > 0 and counts["failed"] == 0  # cancelled, not failed
    assert read_jsonl(out / "failures.jsonl") == []
    # What is true: how far it got and how to finish; no failures to point at.
    recorded = counts["succeeded"]
    flat = " ".join(stdout.split())  # the terminal may wrap the line
    assert (
        f"Stopped (interrupted by {sig.name}): {recorded} of 30 rollouts recorded, "
        f"{counts['pending']} pending." in flat
    )
    assert "same `rollgym run` command and --resume" in flat
    assert "failures" not in flat.split("Stopped (")[1], stdout

    done = rollgym(*args, "--resume")
    assert done.returncode == 0, done.stderr
    rollouts, _ = assert_ledger_invariant(out)
    assert len(rollouts) == 30


def test_the_failure_budget_aborts_and_resume_finishes_the_run(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.touch()
    cfg = write_config(tmp_path / "cfg.yaml", fail_while_exists=str(broken))
    tasks = write_tasks(tmp_path / "tasks.jsonl", 12)
    out = tmp_path / "out"
    args = ["run", cfg, "-i", tasks, "-o", out, "--no-progress", "--concurrency", "2"]

    done = rollgym(*args, "--max-failures", "3")
    assert done.returncode == 2, done.stderr
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["status"] == "aborted" and run["exit_code"] == 2
    abort = run["abort"]
    assert "3 rollouts failed" in abort["reason"]
    assert abort["by_server"] == {"model": 3} and abort["by_status"] == {"500": 3}
    assert abort["sample_error"]["server"] == "model"
    assert FAULT_MESSAGE in abort["sample_error"]["body"]
    assert len(read_jsonl(out / "failures.jsonl")) == 3
    assert "aborted" in done.stdout and "--resume" in done.stdout

    broken.unlink()  # the model is fixed
    done = rollgym(*args, "--resume")
    assert done.returncode == 0, done.stderr
    rollouts, failures = assert_ledger_invariant(out)
    assert failures == [] and len(rollouts) == 12
    assert orjson.loads((out / "run.json").read_bytes())["status"] == "completed"


def test_serve_starts_the_servers_and_sigterm_stops_them_all(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml")
    urls_file = tmp_path / "urls.json"
    proc = subprocess.Popen(
        [ROLLGYM, "serve", str(cfg), "--write-urls", str(urls_file)],
        env=ENV,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: printed.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        wait_for(urls_file.exists, 30, "serve to write its URLs")
        urls = orjson.loads(urls_file.read_bytes())
        assert sorted(urls) == ["agent", "env", "model"]
        # The table is on stdout while the servers run, not only once they stop.
        wait_for(lambda: urls["agent"][0] in "".join(printed), 5, "the printed URL table")
        servers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(servers) == 3

        request = urllib.request.Request(
            urls["agent"][0] + "/run",
            data=orjson.dumps(task_row(4)),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            body = orjson.loads(resp.read())
        assert body["reward"] == 1.0 and body["expected_answer"] == "v4"

        # Many runs against one set of servers: `collect` reads the URLs serve wrote.
        tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
        out = tmp_path / "out"
        args = ["-i", tasks, "-o", out, "--no-progress"]
        done = rollgym("collect", cfg, "--servers", urls_file, *args)
        assert done.returncode == 0, done.stderr
        assert len(assert_ledger_invariant(out)[0]) == 3

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert still_alive(servers, timeout=2) == []


@pytest.mark.parametrize("command", ["run", "collect", "serve"])
def test_help_names_every_option_and_the_exit_codes(command: str) -> None:
    from rollgym.cli.main import _register, app

    if not app.registered_commands:
        _register()
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    options = [opt for p in click_command.params for opt in p.opts + p.secondary_opts]
    env = {**ENV, "COLUMNS": "80"}  # a normal terminal: no option may be cut short
    done = subprocess.run(
        [ROLLGYM, command, "--help"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    missing = [opt for opt in options if opt.startswith("-") and opt not in text]
    assert not missing, f"{command} --help lacks {missing}:\n{text}"
    flat = " ".join(text.split())
    if command == "serve":
        assert "Exit code 0" in flat and "2:" in flat
    else:
        assert "Exit codes: 0 all rollouts succeeded; 1 the run completed" in flat
        assert "2 the run could not start" in flat
