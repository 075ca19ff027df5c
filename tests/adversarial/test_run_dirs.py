"""Run directories as hostile input to ``rollgym health`` and ``rollgym report`` (issue 36,
item 5): a ledger file that is a link (to ``/dev/zero``, to a secret outside the run), a FIFO,
a line of hundreds of megabytes, and a run ten times larger.

Every probe runs the tools in a child process: with a timeout (a FIFO would block, a link to
``/dev/zero`` would read forever) and an address-space limit (what ``/dev/zero`` cost before:
18.9 GB), and memory is the child's own peak (``VmHWM``: ``ru_maxrss`` of a child carries
its parent's over ``exec``, see ``bench/peak.py``).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from rollgym.errors import ConfigError, InputError
from tests.health.seeded import failure, rollout, write_jsonl, write_run
from tests.support.stack import stack_data, write_tasks

_GIB = 1 << 30
_MIB = 1 << 20
SECRET = "root:$6$rollgym-secret-hash:19000:0:99999:7:::"

_MEASURE = """
import sys
from pathlib import Path
from rollgym.errors import RollgymError
try:
    if sys.argv[1] == "health":
        from rollgym.health import check_run
        check_run(Path(sys.argv[2]))
        print("ok")
    else:
        from rollgym.report import write_report
        write_report(Path(sys.argv[2]))
        print("ok")
except RollgymError as err:
    print(err)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(hwm)
"""


def _limited() -> None:
    # A reader that follows /dev/zero fails here in seconds instead of taking the machine.
    resource.setrlimit(resource.RLIMIT_AS, (4 * _GIB, 4 * _GIB))


def _rollgym(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``rollgym ARGS`` in a child process, bounded in time and memory."""
    return subprocess.run(
        [sys.executable, "-m", "rollgym", *(str(a) for a in args)],
        capture_output=True, text=True, timeout=timeout, preexec_fn=_limited, check=False,
    )  # fmt: skip


def _peak(what: str, run: Path) -> tuple[str, int]:
    """(what ``health`` / ``report`` said, its peak RSS in bytes) on ``run``, in a child."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, what, str(run)],
        capture_output=True, text=True, timeout=120, preexec_fn=_limited, check=True,
    )  # fmt: skip
    said, hwm = done.stdout.rsplit("\n", 2)[:2]
    return said, int(hwm) * 1024


def _refused(done: subprocess.CompletedProcess[str], name: str, why: str) -> str:
    """The error of a refused run directory: exit non-zero, the file named, no traceback."""
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert name in said and why in said, said
    assert "Traceback" not in said, said
    return said


@pytest.mark.timeout(150)
@pytest.mark.parametrize("command", ["health", "report"])
def test_a_ledger_linked_to_dev_zero_is_refused_not_read(tmp_path: Path, command: str) -> None:
    run = write_run(tmp_path / "run", 2, 2)
    (run / "rollouts.jsonl").unlink()
    (run / "rollouts.jsonl").symlink_to("/dev/zero")
    said = _refused(_rollgym(command, run), "rollouts.jsonl", "symbolic link")
    assert said.count("rollouts.jsonl") == 1, said  # "run: rollouts.jsonl is a symbolic link"
    assert not (run / "report.html").exists()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("command", ["health", "report"])
def test_a_ledger_linked_to_a_secret_is_refused_and_the_secret_never_shown(
    tmp_path: Path, command: str
) -> None:
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\ndaemon:*:19000:0:99999:7:::\n")
    run = write_run(tmp_path / "run", 2, 2)
    (run / "rollouts.jsonl").unlink()
    (run / "rollouts.jsonl").symlink_to(secret)
    said = _refused(_rollgym(command, run), "rollouts.jsonl", "symbolic link")
    assert "rollgym-secret-hash" not in said
    page = run / "report.html"
    assert not page.exists() or "rollgym-secret-hash" not in page.read_text()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("command", ["health", "report"])
def test_a_fifo_in_the_run_directory_is_refused_without_blocking(
    tmp_path: Path, command: str
) -> None:
    run = write_run(tmp_path / "run", 2, 2)
    (run / "failures.jsonl").unlink()
    os.mkfifo(run / "failures.jsonl")  # nobody ever writes it: a reader that opens it waits
    _refused(_rollgym(command, run), "failures.jsonl", "not a regular file")


@pytest.mark.parametrize("block", [1, 3, 8, 1 << 20])
def test_lines_are_read_whole_within_the_limit_and_measured_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    # Lines inside a block, across blocks, at the limit and past it, and a last line without
    # its newline: each yields where it starts, its size, and its bytes only within the limit.
    from rollgym.collect import layout

    monkeypatch.setattr(layout, "_CHUNK", block)
    data = b"ab\n\nxxxxxxxxxx\n" + b"y" * 11 + b"\nz\n" + b"w" * 12
    path = tmp_path / "lines.jsonl"
    path.write_bytes(data)
    fh = layout.open_run_file(path)
    assert fh is not None
    with fh:
        got = [(r.lineno, r.offset, r.raw, r.size) for r in layout.raw_lines(fh, limit=10)]
    assert got == [
        (1, 0, b"ab\n", 3),
        (2, 3, b"\n", 1),
        (3, 4, b"x" * 10 + b"\n", 11),  # at the limit: the newline is not counted
        (4, 15, None, 12),
        (5, 27, b"z\n", 2),
        (6, 29, None, 12),
    ]


def _with_long_line(root: Path, size: int) -> Path:
    """A clean run of 2 x 2 whose second ledger line holds ``size`` bytes of valid JSON."""
    run = write_run(root, 2, 2, rollouts=[rollout(0, 0)])
    pad = b"x" * size
    with (run / "rollouts.jsonl").open("ab") as fh:
        fh.write(b'{"task_index": 0, "rollout_index": 1, "pad": "' + pad + b'"}\n')
        for key in ((1, 0), (1, 1)):
            fh.write(orjson.dumps(rollout(*key)) + b"\n")
    return run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", ["health", "report"])
def test_a_line_of_200_mb_is_named_too_long_and_never_held(tmp_path: Path, command: str) -> None:
    baseline = _with_long_line(tmp_path / "short", 10)
    run = _with_long_line(tmp_path / "long", 200 * _MIB)
    _, before = _peak(command, baseline)
    said, after = _peak(command, run)
    # Reading the line whole would take 200 MB at least (and its parse more).
    assert after - before < 40 * _MIB, (before, after)
    if command == "health":
        assert "rollouts.jsonl:2: a line of" in said and "longer than any record" in said, said
    else:  # the report skips it, and its health section names it
        assert said == "ok"
        assert "rollouts.jsonl:2: a line of" in (run / "report.html").read_text()


def _big_run(root: Path, lines: int) -> Path:
    """A run of ``lines`` ledger lines, 4 repeats a task, every third one a failure."""
    rows = lines // 4
    ok = [rollout(t, r, at=1.8e9 + t) for t in range(rows) for r in range(4) if (t + r) % 3]
    bad = [failure(t, r, at=1.8e9 + t) for t in range(rows) for r in range(4) if not (t + r) % 3]
    write_run(root, rows, 4, rollouts=ok, failures=bad)
    write_jsonl(root / "run.json", [{"status": "completed", "total": lines}])
    return root


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", ["health", "report"])
def test_memory_does_not_grow_with_the_run(tmp_path: Path, command: str) -> None:
    _, small = _peak(command, _big_run(tmp_path / "small", 20_000))
    said, large = _peak(command, _big_run(tmp_path / "large", 200_000))
    assert said == "ok"
    # Ten times the records: what grows is the run's shape (a byte a rollout, a few words a
    # task), 2 MB here; holding each record's numbers took 35 MB and more.
    assert large - small < 30 * _MIB, (small, large)


def _config(root: Path) -> Path:
    config = root / "cfg.yaml"
    config.write_text(yaml.safe_dump(stack_data()))
    return config


@pytest.mark.timeout(150)
def test_resume_with_run_json_linked_to_dev_zero_is_refused_not_read(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", 2, 2)
    (run / "run.json").unlink()
    (run / "run.json").symlink_to("/dev/zero")  # read whole, it fills the address space
    said = _refused(_rollgym("run", _config(tmp_path), "--resume", "-o", run, "--no-progress"),
                    "run.json", "symbolic link")  # fmt: skip
    # Named once, with its folder: "run: run.json is a symbolic link (to /dev/zero); ..."
    assert said.count("run.json") == 1, said
    assert f"{run}: run.json is a symbolic link (to /dev/zero)" in said.replace("\n", ""), said


@pytest.mark.timeout(150)
@pytest.mark.parametrize("resume", [True, False])
def test_a_fifo_run_json_is_refused_without_blocking(tmp_path: Path, resume: bool) -> None:
    # --resume reads run.json for its input; a new run reads it to see whether the run there
    # ever started. Nobody writes the FIFO: a reader that opens it waits forever.
    run = write_run(tmp_path / "run", 2, 2, rollouts=[])
    (run / "failures.jsonl").unlink()
    (run / "rollouts.jsonl").unlink()
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    given = ["--resume"] if resume else ["-i", write_tasks(tmp_path / "tasks.jsonl", 2)]
    done = _rollgym("run", _config(tmp_path), *given, "-o", run, "--no-progress")
    _refused(done, "run.json", "not a regular file")


@pytest.mark.timeout(60)  # a reader that opens the FIFO waits for a writer that never comes
def test_a_fifo_tasks_file_is_refused_by_the_collectors_readers(tmp_path: Path) -> None:
    from rollgym.collect.metrics import compute_metrics
    from rollgym.collect.tasks import iter_rollouts

    run = write_run(tmp_path / "run", 2, 2)
    (run / "tasks.jsonl").unlink()
    os.mkfifo(run / "tasks.jsonl")
    with pytest.raises(InputError, match=r"tasks.jsonl: is a FIFO, not a regular file"):
        next(iter_rollouts(run / "tasks.jsonl"))
    with pytest.raises(InputError, match=r"tasks.jsonl: is a FIFO, not a regular file"):
        compute_metrics(run, 4, 2)


@pytest.mark.timeout(150)
def test_a_tasks_line_past_the_limit_is_named_not_dispatched(tmp_path: Path) -> None:
    from rollgym.collect.layout import LINE_LIMIT
    from rollgym.collect.tasks import iter_rollouts

    run = write_run(tmp_path / "run", 2, 2)
    pad = b"x" * (LINE_LIMIT + 1)
    with (run / "tasks.jsonl").open("ab") as fh:
        fh.write(b'{"task_index": 1, "rollout_index": 1, "n": 7, "pad": "' + pad + b'"}\n')
    with pytest.raises(InputError, match=r"tasks.jsonl:5: a line of \d+ bytes, longer than"):
        list(iter_rollouts(run / "tasks.jsonl"))


def test_a_stream_never_writes_through_a_link_left_in_its_directory(tmp_path: Path) -> None:
    from rollgym.trainer.stream_ledger import StreamLedger

    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere.jsonl"  # not there yet: the link dangles
    (out / "rollouts.jsonl").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"already holds a run \(rollouts\.jsonl\)"):
        StreamLedger(out).open()
    assert not elsewhere.exists()
