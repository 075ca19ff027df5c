"""The run directory: laid out (or checked, on resume) before anything is sent, and the one writer
of its ``run.json`` (``prepare_run``, ``mark_code`` once the servers answer, then
``mark_finished``, ``mark_failed_to_start`` or ``mark_aborted``; the file names are
``layout.RunDir``'s).

``prepare_run`` checks that ``--output`` can be written, validates the whole input (a bad line
fails the run with its file and line, nothing dispatched), then writes ``tasks.jsonl`` and
``run.json``; on ``--resume`` it checks that the input, ``--repeats`` and ``--limit`` are those
of the original run, and moves the previous session's outcome to ``run.json``'s ``history``.

A live run holds an exclusive ``flock`` on ``run.lock`` in its directory. The kernel drops it
when the process ends, however it ends (SIGKILL included), so a ``run.json`` that still says
``running`` while nobody holds the lock belongs to a run that died (``read_state``), and a
second run (or ``--resume``) cannot write into the directory of a live one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.dialect import Dialects
from rollgym.collect.layout import (
    FAILURES,
    LOCK,
    LOGS,
    ROLLOUTS,
    RUN_JSON,
    TASKS,
    RunDir,
    not_followed,
)
from rollgym.collect.route import AgentRoute
from rollgym.collect.tasks import TaskFileInfo, materialize, scan_tasks
from rollgym.config import CollectConfig, Config
from rollgym.errors import ConfigError, RollgymError
from rollgym.server.provenance import LoadedCode
from rollgym.version import __version__

EXIT_OK = 0
EXIT_SOME_FAILED = 1
EXIT_ABORTED = 2
EXIT_BUDGET = 3
"""Exit codes: all rollouts succeeded / the run completed with failed rollouts / the run could
not start or was aborted (failure budget, configuration error, interrupt) / the run stopped
cleanly at its budget (``collect.budget``) with rollouts left for ``--resume``."""

LOCK_FILE = LOCK
LOGS_DIR = LOGS
OWN_FILES = RunDir.OWN_FILES
"""What a run writes in its directory: none of them (nor their ``.tmp``) may be a link."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
FAILED_TO_START = "failed_to_start"
DIED = "died"
"""What ``read_state`` calls a run whose ``run.json`` says ``running`` with nobody alive."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file), never through a
    link: the temporary file is created anew (a link left in its place is removed, not
    followed), and the rename replaces a link at ``path`` instead of writing where it points."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC
    with open(os.open(tmp, flags, 0o644), "wb") as out:
        out.write(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


class RunLock:
    """The exclusive ``flock`` on ``OUT/run.lock`` that a live run holds."""

    _WAIT_S = 1.0  # a reader's probe holds a shared lock for microseconds: wait that out

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def acquire(cls, out_dir: Path) -> RunLock | None:
        """The lock of ``out_dir``, or None while another process holds it."""
        flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_CLOEXEC
        fd = os.open(out_dir / LOCK_FILE, flags, 0o644)
        deadline = time.monotonic() + cls._WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return cls(fd)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
                time.sleep(0.05)

    def release(self) -> None:
        """Let go of the lock (closing the file drops it); idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def lock_held(out_dir: Path) -> bool:
    """Whether a live process holds ``out_dir``'s run lock (this one included)."""
    try:
        fd = os.open(out_dir / LOCK_FILE, os.O_RDONLY | _NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock, if taken
    return False


@dataclass(frozen=True)
class RunState:
    """Where the run in a directory stands, for ``--resume`` and any other reader."""

    status: str
    """``run.json``'s status (``running``, ``completed``, ``aborted``...), or ``died`` when it
    says ``running`` but the process that wrote it no longer holds ``run.lock``."""
    pid: int | None
    host: str | None
    started_at: str | None

    @property
    def alive(self) -> bool:
        return self.status == "running"


def read_state(out_dir: Path) -> RunState | None:
    """The state of the run in ``out_dir``; None if it holds no readable ``run.json``
    (``InputError`` if it is a link or no regular file: ``layout.open_run_file``)."""
    info = RunDir(out_dir).read_json(RUN_JSON)
    if not info:
        return None
    process = info.get("process") or {}
    status = str(info.get("status"))
    # Runs prepared without the lock (the Python API's prepare_run) cannot be judged: their
    # "running" is taken at its word.
    if status == "running" and process.get("locked") and not lock_held(out_dir):
        status = DIED
    started = (info.get("resumes") or [info.get("started_at")])[-1]
    return RunState(status, process.get("pid"), process.get("host"), started)


@dataclass(frozen=True)
class RecordedInputs:
    """What identifies a run, as its ``run.json`` recorded it: ``--resume`` reuses these."""

    input: Path | None
    repeats: int | None
    limit: int | None


def recorded_inputs(out_dir: Path) -> RecordedInputs | None:
    """The input, repeats and limit of the run in ``out_dir`` (None: no readable run.json).
    Read before the directory is checked (``--resume`` takes its input from here), so through
    ``open_run_file`` like every read of a run file: ``InputError`` for a link or a FIFO."""
    inputs = RunDir(out_dir).read_json(RUN_JSON).get("inputs")
    if not isinstance(inputs, dict):
        return None
    given = inputs.get("input")
    path = Path(given) if isinstance(given, str) and given else None
    return RecordedInputs(path, inputs.get("repeats"), inputs.get("limit"))


@dataclass
class PreparedRun:
    config: Config
    collect: CollectConfig
    out_dir: Path
    info: TaskFileInfo
    total: int
    resume: bool
    run_info: dict[str, Any] = field(default_factory=dict)
    lock: RunLock | None = None
    dialects: Dialects = field(default_factory=Dialects)
    """The row dialects the run speaks (``collect.dialect``)."""

    @property
    def files(self) -> RunDir:
        return RunDir(self.out_dir)

    def release(self) -> None:
        """Drop the run lock: the run is over (``run.json`` says how it ended)."""
        if self.lock is not None:
            self.lock.release()


@dataclass
class RunOutcome:
    status: str
    exit_code: int
    metrics: dict[str, Any]
    out_dir: Path
    abort_reason: str | None = None


def prepare_run(
    config: Config,
    collect: CollectConfig,
    input_path: Path,
    out_dir: Path,
    *,
    resume: bool,
    lock: bool = False,
    dialects: Dialects | None = None,
) -> PreparedRun:
    """Validate the input and set up (or check, on resume) the output directory. ``lock``:
    hold ``run.lock`` until ``PreparedRun.release`` (``run_collection`` does); either way a
    directory whose run is still alive is refused. ``dialects``: the row shapes the run
    speaks besides the flat row (an entry point's list, ``rollgym.dialects``)."""
    _check_output(out_dir)
    dialects = dialects or Dialects()
    info = scan_tasks(input_path, collect.limit, AgentRoute.of(config, collect), dialects)
    fingerprint = {
        "input": str(input_path.absolute()),  # absolute: --resume may run from elsewhere
        "input_sha256": info.sha256,
        "tasks": info.tasks,
        "repeats": collect.repeats,
        "limit": collect.limit,
    }
    try:
        return _prepare(
            config, collect, input_path, out_dir, fingerprint, info, resume, lock, dialects
        )
    except OSError as exc:
        raise ConfigError(
            f"--output {out_dir}: cannot write the run there ({exc.strerror or exc}); choose a "
            "directory you can write to"
        ) from None


def _prepare(
    config: Config,
    collect: CollectConfig,
    input_path: Path,
    out_dir: Path,
    fingerprint: dict[str, Any],
    info: TaskFileInfo,
    resume: bool,
    lock: bool,
    dialects: Dialects,
) -> PreparedRun:
    run_json = RunDir(out_dir).run_json
    tasks_path = RunDir(out_dir).tasks
    if resume:
        if not run_json.exists() or not tasks_path.exists():
            raise ConfigError(f"{out_dir}: nothing to resume (no run.json / tasks.jsonl)")
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
    held = _claim(out_dir, lock)
    try:
        if resume:
            run_info = RunDir(out_dir).read_json(RUN_JSON)
            if not isinstance(run_info.get("total"), int):
                raise ConfigError(
                    f"{run_json}: holds no run rollgym recorded (no JSON object with its "
                    "total), so there is nothing to resume; start a new output directory"
                )
            _check_same_inputs(out_dir, run_info.get("inputs", {}), fingerprint)
            total = int(run_info["total"])
            _close_session(run_info)
            run_info.setdefault("resumes", []).append(now())
        else:
            _refuse_earlier_run(out_dir)
            total = materialize(input_path, tasks_path, collect.repeats, collect.limit, dialects)
            run_info = {"started_at": now()}
        run_info.update(
            {
                "status": "running",
                "process": {"pid": os.getpid(), "host": socket.gethostname(), "locked": lock},
                "inputs": fingerprint,
                "total": total,
                "config": config.model_dump(mode="json"),
                "collect": collect.model_dump(mode="json"),
                "argv": sys.argv,
                "versions": {"rollgym": __version__, "python": platform.python_version()},
            }
        )
        write_json(run_json, run_info)
    except BaseException:
        if held is not None:
            held.release()
        raise
    return PreparedRun(config, collect, out_dir, info, total, resume, run_info, held, dialects)


def _check_output(out_dir: Path) -> None:
    """Refuse an ``--output`` that is a file or lies under one, before the input is read."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(
            f"--output {out_dir}: is a file, not a directory; choose a directory (it is "
            "created if missing)"
        )
    for parent in out_dir.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(
                    f"--output {out_dir}: {parent} is a file, so no directory can be made "
                    "under it; choose another --output"
                )
            break
    if out_dir.is_dir():
        _refuse_links(out_dir)


def _refuse_links(out_dir: Path) -> None:
    """Refuse a run directory where a file the run writes is a symbolic link: a link planted
    there (by anything that can write the directory) would point the run's writes, as this
    user, anywhere. The link is left as found, for the person to look at."""
    for name in OWN_FILES:
        for path in (out_dir / name, out_dir / f"{name}.tmp"):
            if path.is_symlink():
                raise ConfigError(
                    f"--output {out_dir}: {not_followed(path)}: remove the link, or choose "
                    "another --output"
                )
    logs = out_dir / LOGS_DIR
    if logs.exists() and not logs.is_dir():
        raise ConfigError(
            f"--output {out_dir}: {LOGS_DIR} is not a directory; the servers' logs go there: "
            "remove it, or choose another --output"
        )
    for path in logs.iterdir() if logs.is_dir() else ():
        if path.is_symlink():
            raise ConfigError(
                f"--output {out_dir}: {LOGS_DIR}/{path.name} is a symbolic link (to "
                f"{os.readlink(path)}); rollgym never writes through a link in its run "
                "directory: remove the link, or choose another --output"
            )


_RUN_FILES = (RUN_JSON, TASKS, ROLLOUTS, FAILURES)
# The keys of run.json that describe one session (the first run or one resume) and its end.
_SESSION_KEYS = (
    "status", "exit_code", "ended_at", "abort", "error", "startup_seconds", "process", "warnings",
    "metrics_url", "scrape_targets", "code", "fingerprints", "budget",
)  # fmt: skip


def _claim(out_dir: Path, hold: bool) -> RunLock | None:
    """The run lock if ``hold``; refuse a directory whose run is still alive either way."""
    if hold:
        got = RunLock.acquire(out_dir)
        if got is not None:
            return got
    elif not lock_held(out_dir):
        return None
    state = read_state(out_dir)
    who = f"pid {state.pid} on {state.host}, since {state.started_at}" if state else "?"
    stop = f"kill -INT {state.pid}" if state and state.pid else "stop it"
    raise ConfigError(
        f"{out_dir}: a run is still collecting into it ({who}); wait for it to end, or "
        f"stop it ({stop}) and finish it with --resume"
    )


def _refuse_earlier_run(out_dir: Path) -> None:
    earlier = [name for name in _RUN_FILES if (out_dir / name).exists()]
    if earlier and not _never_started(out_dir):
        # Even a run killed before its first record left run.json and tasks.jsonl: starting
        # over would silently replace them under a run someone may want to resume.
        raise ConfigError(
            f"{out_dir}: holds an earlier run ({', '.join(earlier)}); pass --resume to "
            "finish it, or choose another --output directory"
        )


def _close_session(info: dict[str, Any]) -> None:
    """Move the previous session's outcome (status, abort, error...) from the top of
    ``run.json`` to its ``history``: the top shows the current session only."""
    entry: dict[str, Any] = {"started_at": (info.get("resumes") or [info.get("started_at")])[-1]}
    for key in _SESSION_KEYS:
        if key in info:
            entry[key] = info.pop(key)
    if entry.get("status") == "running":
        # We hold the lock (or no one took one): the process that wrote this is gone.
        entry["status"] = DIED
    info.setdefault("history", []).append(entry)


def _never_started(out_dir: Path) -> bool:
    files = RunDir(out_dir)
    if files.rollouts.exists() or files.failures.exists():
        return False
    return bool(files.read_json(RUN_JSON).get("status") == FAILED_TO_START)


def mark_finished(run: PreparedRun, status: str, exit_code: int, **ended: Any) -> None:
    """Record in ``run.json`` how the run ended (the collector, once ``metrics.json`` is
    written): ``status``, ``exit_code`` and what else the session's end adds (``abort``, the
    dispatcher's sections)."""
    run.run_info.update(status=status, exit_code=exit_code, ended_at=now(), **ended)
    write_json(run.files.run_json, run.run_info)


def mark_code(run: PreparedRun, replicas: dict[str, list[LoadedCode | None]]) -> None:
    """Record in ``run.json`` (``code``) which code each server runs, as its replicas said
    (``/health``), at once: a run killed later still says which verifier scored it. A server
    is recorded by its first replica (None: it did not say, not being rollgym's); a replica
    that runs other code than the first is named in ``warnings``."""
    code: dict[str, Any] = {}
    for name, said in replicas.items():
        first = said[0] if said else None
        code[name] = first.to_dict() if first is not None else None
        for index, other in enumerate(said[1:], start=1):
            if other != first:
                run.run_info.setdefault("warnings", []).append(
                    f"server {name}: replica {index} runs other code than replica 0 "
                    f"({_describe(other)}, not {_describe(first)})"
                )
    run.run_info["code"] = code
    write_json(run.files.run_json, run.run_info)


def _describe(code: LoadedCode | None) -> str:
    if code is None:
        return "unknown"
    return f"{code.file or code.module} sha256 {(code.sha256 or '?')[:12]}"


def recorded_code(out_dir: Path) -> dict[str, LoadedCode | None]:
    """Server name -> the code it ran, as the run in ``out_dir`` recorded it (``mark_code``);
    empty if it recorded none."""
    code = RunDir(out_dir).read_json(RUN_JSON).get("code")
    if not isinstance(code, dict):
        return {}
    return {str(name): LoadedCode.from_dict(said) for name, said in code.items()}


def mark_failed_to_start(run: PreparedRun, err: RollgymError) -> None:
    """Record in ``run.json`` that the run never dispatched (its servers did not start...)."""
    run.run_info.update(
        status=FAILED_TO_START, exit_code=EXIT_ABORTED, ended_at=now(), error=err.to_dict()
    )
    write_json(run.files.run_json, run.run_info)


def mark_aborted(run: PreparedRun, reason: str) -> None:
    """Record in ``run.json`` that a run stopped without writing its own end (interrupted
    where the collector does not handle signals, or crashed); what it recorded is kept."""
    if run.run_info.get("status") != "running":
        return  # the collector wrote how it ended
    run.run_info.update(
        status="aborted", exit_code=EXIT_ABORTED, ended_at=now(), abort={"reason": reason}
    )
    write_json(run.files.run_json, run.run_info)


# What must match between a run and its resume, with the name a person knows it by.
_RESUME_KEYS = {
    "input_sha256": "the input file's content",
    "repeats": "--repeats",
    "limit": "--limit",
}


def _check_same_inputs(out_dir: Path, before: dict[str, Any], current: dict[str, Any]) -> None:
    for key, what in _RESUME_KEYS.items():
        if before.get(key) != current[key]:
            then, later = before.get(key), current[key]
            if key == "input_sha256":
                then = f"{before.get('input')} sha256 {str(then)[:12]}"
                later = f"{current['input']} sha256 {str(later)[:12]}"
            raise ConfigError(
                f"{out_dir}: cannot resume: {what} differs from the original run "
                f"({then} then, {later} now); resume with the same input, --repeats and "
                "--limit (or leave them out: --resume reuses the run's own), or start a new "
                "output directory"
            )
