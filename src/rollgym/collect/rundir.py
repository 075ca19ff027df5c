"""The run directory: laid out (or checked, on resume) before anything is sent.

``prepare_run`` validates the whole input first (a bad line fails the run with its file and
line, nothing dispatched), then writes ``tasks.jsonl`` and ``run.json``; on ``--resume`` it
checks that the input, ``--repeats`` and ``--limit`` are those of the original run.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from rollgym import __version__
from rollgym.collect.tasks import AgentRoute, TaskFileInfo, materialize, scan_tasks
from rollgym.config import CollectConfig, Config
from rollgym.errors import ConfigError, RollgymError

EXIT_OK = 0
EXIT_SOME_FAILED = 1
EXIT_ABORTED = 2
"""Exit codes: all rollouts succeeded / the run completed with failed rollouts / the run could
not start or was aborted (failure budget, configuration error, interrupt)."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


@dataclass
class PreparedRun:
    config: Config
    collect: CollectConfig
    out_dir: Path
    info: TaskFileInfo
    total: int
    resume: bool
    run_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunOutcome:
    status: str
    exit_code: int
    metrics: dict[str, Any]
    out_dir: Path
    abort_reason: str | None = None


def prepare_run(
    config: Config, collect: CollectConfig, input_path: Path, out_dir: Path, *, resume: bool
) -> PreparedRun:
    """Validate the input and set up (or check, on resume) the output directory."""
    info = scan_tasks(input_path, collect.limit, AgentRoute.of(config, collect))
    fingerprint = {
        "input": str(input_path),
        "input_sha256": info.sha256,
        "tasks": info.tasks,
        "repeats": collect.repeats,
        "limit": collect.limit,
    }
    run_json = out_dir / "run.json"
    tasks_path = out_dir / "tasks.jsonl"
    if resume:
        if not run_json.exists() or not tasks_path.exists():
            raise ConfigError(f"{out_dir}: nothing to resume (no run.json / tasks.jsonl)")
        previous = orjson.loads(run_json.read_bytes())
        before = previous.get("inputs", {})
        _check_same_inputs(out_dir, before, fingerprint)
        total = int(previous["total"])
        run_info = previous
        run_info.setdefault("resumes", []).append(now())
    else:
        earlier = [name for name in _RUN_FILES if (out_dir / name).exists()]
        if earlier and _never_started(out_dir):
            earlier = []  # a run that failed to start recorded nothing: start it afresh
        if earlier:
            # Even a run killed before its first record left run.json and tasks.jsonl: starting
            # over would silently replace them under a run someone may want to resume.
            raise ConfigError(
                f"{out_dir}: holds an earlier run ({', '.join(earlier)}); pass --resume to "
                "finish it, or choose another --output directory"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        total = materialize(input_path, tasks_path, collect.repeats, collect.limit)
        run_info = {"started_at": now()}
    run_info.update(
        {
            "status": "running",
            "inputs": fingerprint,
            "total": total,
            "config": config.model_dump(mode="json"),
            "collect": collect.model_dump(mode="json"),
            "argv": sys.argv,
            "versions": {"rollgym": __version__, "python": platform.python_version()},
        }
    )
    write_json(run_json, run_info)
    return PreparedRun(config, collect, out_dir, info, total, resume, run_info)


_RUN_FILES = ("run.json", "tasks.jsonl", "rollouts.jsonl", "failures.jsonl")
FAILED_TO_START = "failed_to_start"


def _never_started(out_dir: Path) -> bool:
    run_json = out_dir / "run.json"
    if (out_dir / "rollouts.jsonl").exists() or (out_dir / "failures.jsonl").exists():
        return False
    try:
        return bool(orjson.loads(run_json.read_bytes()).get("status") == FAILED_TO_START)
    except (OSError, orjson.JSONDecodeError):
        return False


def mark_failed_to_start(run: PreparedRun, err: RollgymError) -> None:
    """Record in ``run.json`` that the run never dispatched (its servers did not start...)."""
    run.run_info.update(
        status=FAILED_TO_START, exit_code=EXIT_ABORTED, ended_at=now(), error=err.to_dict()
    )
    write_json(run.out_dir / "run.json", run.run_info)


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
                "--limit, or start a new output directory"
            )
