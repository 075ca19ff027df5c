"""Task files: validated up front, streamed, expanded into rollouts.

The input is read twice and never held whole: once to validate every line (nothing is dispatched
if any line is bad) and fingerprint the file, once to write ``tasks.jsonl`` with repeats expanded
and each row stamped with ``task_index`` and ``rollout_index``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from rollgym.errors import InputError
from rollgym.protocol import TaskRow


@dataclass(frozen=True)
class TaskFileInfo:
    path: str
    tasks: int
    sha256: str


def _reason(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "row"
    if err["type"] == "missing":
        return f"missing required field '{key}'"
    return f"{key}: {err['msg']}"


def scan_tasks(
    path: str | Path, limit: int | None = None, agents: set[str] | None = None
) -> TaskFileInfo:
    """Validate every line of a task file; raise ``InputError`` naming the file and line."""
    path = Path(path)
    digest = hashlib.sha256()
    count = 0
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read task file: {exc.strerror or exc}") from None
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if limit is not None and count >= limit:
                break
            digest.update(line)
            if not line.strip():
                continue
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid JSON: {exc}") from None
            if not isinstance(data, dict):
                raise InputError(f"{path}:{lineno}: a task must be a JSON object")
            try:
                row = TaskRow.model_validate(data)
            except ValidationError as exc:
                raise InputError(f"{path}:{lineno}: {_reason(exc)}") from None
            if (
                agents is not None
                and row.agent_ref is not None
                and row.agent_ref.name not in agents
            ):
                raise InputError(
                    f"{path}:{lineno}: agent_ref.name {row.agent_ref.name!r} is not an agent of "
                    f"the config (agents: {', '.join(sorted(agents)) or 'none'})"
                )
            count += 1
    if count == 0:
        raise InputError(f"{path}: no tasks in the file")
    return TaskFileInfo(str(path), count, digest.hexdigest())


def iter_tasks(path: str | Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Stream the task rows of an already-validated file."""
    count = 0
    with Path(path).open("rb") as fh:
        for line in fh:
            if limit is not None and count >= limit:
                return
            if line.strip():
                count += 1
                yield orjson.loads(line)


def materialize(source: str | Path, dest: Path, repeats: int, limit: int | None = None) -> int:
    """Write ``tasks.jsonl``: every task ``repeats`` times, stamped; return the rollout count."""
    total = 0
    tmp = dest.with_suffix(".jsonl.tmp")
    with tmp.open("wb") as out:
        for task_index, row in enumerate(iter_tasks(source, limit)):
            row.pop("task_index", None)
            row.pop("rollout_index", None)
            for rollout_index in range(repeats):
                stamped = {**row, "task_index": task_index, "rollout_index": rollout_index}
                out.write(orjson.dumps(stamped) + b"\n")
                total += 1
    tmp.replace(dest)
    return total


def iter_rollouts(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(task_index, rollout_index, raw line) of every row of ``tasks.jsonl``."""
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                row = orjson.loads(line)
                yield row["task_index"], row["rollout_index"], line.rstrip(b"\n")
