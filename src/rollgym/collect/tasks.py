"""Task files: validated up front, streamed, expanded into rollouts.

The input is read twice and never held whole: once to validate every line (nothing is dispatched
if any line is bad), fingerprint the file and note the row fields it uses, once to write
``tasks.jsonl`` with repeats expanded and each row stamped with its indices in both spellings:
rollgym's ``task_index`` / ``rollout_index`` and NeMo Gym's ``_ng_task_index`` /
``_ng_rollout_index``.

The ``_ng_*`` indices on input: ``_ng_task_index`` names the task (a caller's value, e.g. a
global index across the chunks of a big file) and is kept as given; rollgym's ``task_index`` is
still the line's position. ``_ng_rollout_index`` is replaced by the repeat. Two lines with the
same ``_ng_task_index`` are refused: NeMo Gym would run them as one task's rollouts, rollgym as
two tasks, and pass@k would differ without a word.

Each row is its dialect's (``collect.dialect``: the flat row, or a shape an entry point
listed), checked by it when the file is read and routed as it says: a row no server runs stops
the run there, naming the line. ``tasks.jsonl`` keeps the row as given plus the indices, less the
per-rollout fields its dialect makes its own (``RowCheck.restamp``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.dialect import Dialects, RowCheck
from rollgym.collect.layout import LINE_LIMIT, open_run_file, raw_lines
from rollgym.collect.route import BY_AGENT, AgentRoute
from rollgym.errors import InputError
from rollgym.wire import NG_ROLLOUT_INDEX, NG_TASK_INDEX, PARENT_FIELD

ROLLGYM_ROW_FIELDS = frozenset(
    {
        "responses_create_params",
        "agent_ref",
        "task_index",
        "rollout_index",
        NG_TASK_INDEX,
        "rollgym_check",  # reference and wrong answers for `rollgym check`
        NG_ROLLOUT_INDEX,
        PARENT_FIELD,  # a replay's row: the recorded rollout it replays (rollgym replay)
    }
)
"""Top-level row fields rollgym itself reads; any other is the servers' (``row_fields``)."""

_ROW_LIMIT = LINE_LIMIT - (4 << 10)
"""The longest input line: its row in ``tasks.jsonl`` gains four indices (``materialize``)."""


@dataclass(frozen=True)
class TaskFileInfo:
    path: str
    tasks: int
    sha256: str
    fields: frozenset[str] = frozenset()
    """Every top-level field found in the rows."""
    routes: frozenset[tuple[str, str | None]] = frozenset()
    """Every route the rows ask for (``RowCheck``'s ``by`` and ``name``)."""

    def named(self, by: str) -> frozenset[str]:
        """The names the rows give to be routed ``by`` (agents, tasksets)."""
        return frozenset(name for kind, name in self.routes if kind == by and name is not None)


def scan_tasks(
    path: str | Path,
    limit: int | None = None,
    agents: AgentRoute | Collection[str] | None = None,
    dialects: Dialects | None = None,
) -> TaskFileInfo:
    """Validate every line of a task file (each by its dialect; ``dialects``: the flat row
    only when None); raise ``InputError`` naming the file and line. With ``agents`` (a route,
    or the agent names of the config), every row must be routed to one."""
    path = Path(path)
    route = agents if isinstance(agents, AgentRoute) or agents is None else AgentRoute(
        frozenset(agents)
    )  # fmt: skip
    # Names alone say nothing of a default: only a run's route refuses a row naming no agent.
    needs_default = isinstance(agents, AgentRoute)
    dialects = dialects or Dialects()
    digest = hashlib.sha256()
    count = 0
    fields: set[str] = set()
    routes: set[tuple[str, str | None]] = set()
    ng_tasks: set[int] = set()  # only filled when rows carry ``_ng_task_index``
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
            where = f"{path}:{lineno}"
            if len(line) > _ROW_LIMIT:  # its row of tasks.jsonl would be refused mid-run
                raise InputError(
                    f"{where}: a line of {len(line)} bytes; a task row takes at most "
                    f"{_ROW_LIMIT} (every reader of a run's tasks.jsonl stops at {LINE_LIMIT})"
                )
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InputError(f"{where}: not valid JSON: {exc}") from None
            if not isinstance(data, dict):
                raise InputError(f"{where}: a task must be a JSON object")
            got = dialects.check(data, route, where)
            if route is not None:
                _check_route(got, route, where, needs_default)
            routes.add((got.by, got.name))
            fields.update(got.fields)
            if NG_TASK_INDEX in data:
                _check_ng_task(data[NG_TASK_INDEX], ng_tasks, where)
            count += 1
    if count == 0:
        raise InputError(f"{path}: no tasks in the file")
    return TaskFileInfo(str(path), count, digest.hexdigest(), frozenset(fields), frozenset(routes))


def _check_route(got: RowCheck, route: AgentRoute, where: str, needs_default: bool) -> None:
    """Refuse a row that no server of ``route`` runs."""
    if route.server(got.by, got.name) is not None:
        return
    if got.by != BY_AGENT:
        raise InputError(f"{where}: {route.taskset_refusal(str(got.name))}")
    if got.name is not None:
        raise InputError(f"{where}: {route.refusal(got.name)}")
    if needs_default:
        raise InputError(f"{where}: {route.no_default()}")


def _check_ng_task(value: Any, seen: set[int], where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"{where}: {NG_TASK_INDEX} must be an integer >= 0, not {value!r}")
    if value in seen:
        raise InputError(
            f"{where}: {NG_TASK_INDEX} {value} is also on an earlier line. NeMo Gym runs lines "
            "sharing a task index as rollouts of one task, rollgym runs each line as a task of "
            "its own (--repeats N gives it N rollouts): keep one line per task, or drop "
            f"{NG_TASK_INDEX} to number the tasks by line"
        )
    seen.add(value)


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


def materialize(
    source: str | Path,
    dest: Path,
    repeats: int,
    limit: int | None = None,
    dialects: Dialects | None = None,
) -> int:
    """Write ``tasks.jsonl``: every task ``repeats`` times, stamped with its indices in both
    spellings (without the per-rollout fields its dialect makes its own); return the rollout
    count."""
    dialects = dialects or Dialects()
    total = 0
    tmp = dest.with_suffix(".jsonl.tmp")
    with tmp.open("wb") as out:
        for task_index, row in enumerate(iter_tasks(source, limit)):
            row.pop("task_index", None)
            row.pop("rollout_index", None)
            row.pop(NG_ROLLOUT_INDEX, None)
            if dialects.others:  # the flat row keeps every field it has
                for name in dialects.check(row, None, "").restamp:
                    row.pop(name, None)
            ng_task = row.pop(NG_TASK_INDEX, task_index)
            for rollout_index in range(repeats):
                stamped = {
                    **row,
                    "task_index": task_index,
                    "rollout_index": rollout_index,
                    NG_TASK_INDEX: ng_task,
                    NG_ROLLOUT_INDEX: rollout_index,
                }
                out.write(orjson.dumps(stamped) + b"\n")
                total += 1
    tmp.replace(dest)
    return total


def iter_rollouts(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(task_index, rollout_index, raw line) of every row of ``tasks.jsonl``, read as every
    run file is (``layout.open_run_file``, ``raw_lines``). ``InputError`` naming the file and
    line for one that is no row the run wrote: past ``LINE_LIMIT``, or without its indices."""
    fh = open_run_file(path)
    if fh is None:
        raise InputError(f"{path}: missing; the run wrote it, so resume from a whole directory")
    with fh:
        for got in raw_lines(fh):
            if got.raw is None:
                raise InputError(got.too_long(path))
            if got.raw.strip():
                row = _row_of(got.raw)
                if row is None:
                    raise InputError(f"{path}:{got.lineno}: not a task row with its indices")
                yield row["task_index"], row["rollout_index"], got.raw.rstrip(b"\n")


def _row_of(raw: bytes) -> dict[str, Any] | None:
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    indexed = isinstance(row, dict) and all(
        isinstance(row.get(key), int) for key in ("task_index", "rollout_index")
    )
    return row if indexed else None
