"""Task files: validated up front, streamed, expanded into rollouts.

The input is read twice and never held whole: once to validate every line (nothing is dispatched
if any line is bad), fingerprint the file and note the row fields it uses, once to write
``tasks.jsonl`` with repeats expanded and each row stamped with its indices in both spellings:
rollgym's ``task_index`` / ``rollout_index`` and NeMo Gym's ``_ng_task_index`` /
``_ng_rollout_index``.

NeMo Gym's indices on input: ``_ng_task_index`` names the task (NeMo Gym keeps a caller's value,
e.g. a global index across the chunks of a big file) and is kept as given; rollgym's
``task_index`` is still the line's position. ``_ng_rollout_index`` is replaced by the repeat,
as NeMo Gym does. Two lines with the same ``_ng_task_index`` are refused: NeMo Gym would run
them as one task's rollouts, rollgym as two tasks, and pass@k would differ without a word.

Materialized task rows (NeMo Gym 0.7: ``{task_id: {taskset, task_id}, task_input}``) may stand
beside flat ones, in any mix. Each is routed by its taskset (``AgentRoute.server_for_taskset``),
checked when the file is read: a taskset no server runs stops the run there, naming the line.
A row routed to an agent must give the flat row that agent takes (``flat_row``); one routed to
an environment server is that server's to validate. ``tasks.jsonl`` keeps the row as given plus
the indices; 0.7's per-rollout ``_ng_rollout_id`` and ``_ng_attempt_index`` are replaced by the
run's own (``<_ng_task_index>-<_ng_rollout_index>``, and the attempt of each try).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from rollgym.collect.layout import LINE_LIMIT, open_run_file, raw_lines
from rollgym.config import CollectConfig, Config
from rollgym.errors import InputError, InvalidRequest
from rollgym.nemo_gym.environment_client import flat_row
from rollgym.nemo_gym.episodes import CREATE_PARAMS, TaskId, is_materialized_row
from rollgym.protocol import TaskRow
from rollgym.wire import (
    NG_ATTEMPT_INDEX,
    NG_ROLLOUT_ID,
    NG_ROLLOUT_INDEX,
    NG_TASK_INDEX,
    TASK_ID,
    TASK_INPUT,
    TASKSET,
)

ROLLGYM_ROW_FIELDS = frozenset(
    {
        "responses_create_params",
        "agent_ref",
        "task_index",
        "rollout_index",
        NG_TASK_INDEX,
        "rollgym_check",  # reference and wrong answers for `rollgym check`
        NG_ROLLOUT_INDEX,
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
    agent_refs: frozenset[str] = frozenset()
    """Every ``agent_ref.name`` found in the rows."""
    tasksets: frozenset[str] = frozenset()
    """Every taskset of the materialized rows."""


@dataclass(frozen=True)
class AgentRoute:
    """Which server runs a row. ``agents`` are every server a row can go to: the agent servers
    and the environment servers (``environments``, NeMo Gym 0.7's). A flat row: with
    ``override``, ``default`` runs every row; else the row's ``agent_ref.name``, a server of the
    config or a foreign name (NeMo Gym's ``mcqa_simple_agent``...) that ``aliases`` maps to one;
    a row naming none goes to ``default``. A materialized row: ``default`` with ``override``,
    else ``tasksets[taskset]``, else the config's only agent or environment server."""

    agents: frozenset[str]
    default: str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    override: bool = False
    tasksets: Mapping[str, str] = field(default_factory=dict)
    environments: frozenset[str] = frozenset()

    @classmethod
    def of(cls, config: Config, collect: CollectConfig, default: str | None = None) -> AgentRoute:
        """The route of a run of ``config`` (``default``: the run's agent, else
        ``Config.default_dispatcher``)."""
        agents = frozenset(config.dispatchers())
        if default is None:
            default = config.default_dispatcher(collect.agent)
        environments = frozenset(n for n in agents if config.servers[n].kind == "environment")
        return cls(
            agents, default, dict(collect.agent_aliases), collect.ignore_agent_ref,
            dict(collect.taskset_routes), environments,
        )  # fmt: skip

    def agent_for(self, name: Any) -> str | None:
        """The server for a flat row whose ``agent_ref.name`` is ``name``; ``None`` if no
        server of the run answers to it (or, naming none, there is no default)."""
        if self.override or name is None:
            return self.default
        if name in self.agents:
            return str(name)
        return self.aliases.get(name) if isinstance(name, str) else None

    def server_for_taskset(self, taskset: str) -> str | None:
        """The server for a materialized row of ``taskset``; ``None`` if none is routed."""
        if self.override:
            return self.default
        if taskset in self.tasksets:
            return self.tasksets[taskset]
        return next(iter(self.agents)) if len(self.agents) == 1 else None

    def refusal(self, name: Any) -> str:
        """Why a row naming ``name`` cannot run, and the ways out."""
        known = ", ".join(sorted(self.agents)) or "none"
        target = self.default or "AGENT"
        return (
            f"agent_ref.name {name!r} is not an agent of the config (agents: {known}); "
            f"run every row with --agent {target}, or map the name in the config: "
            f"collect.agent_aliases: {{{name}: {target}}}"
        )

    def no_default(self) -> str:
        """Why a flat row naming no agent cannot run, and the ways out."""
        if not self.agents:
            return (
                "the row names no agent (agent_ref), and the config has no agent or environment "
                "server to run it: add one under servers (kind: agent or environment)"
            )
        known = ", ".join(sorted(self.agents))
        return (
            f"the row names no agent (agent_ref), and the config has several agent and "
            f"environment servers ({known}): name the one for such rows with collect.agent, "
            "or run every row with --agent NAME"
        )

    def taskset_refusal(self, taskset: str) -> str:
        """Why a materialized row of ``taskset`` cannot run, and the ways out."""
        if not self.agents:
            return (
                "the row names no agent (agent_ref), and the config has no agent or environment "
                "server to run it: add one under servers (kind: agent or environment)"
            )
        known = ", ".join(sorted(self.agents))
        return (
            f"no server runs taskset {taskset!r} (agent and environment servers: {known}); "
            f"route it in the config: collect.taskset_routes: {{{taskset!r}: SERVER}}, or run "
            "every row with --agent SERVER"
        )


class _Materialized(BaseModel):
    """What rollgym reads of a materialized row itself: its task id (0.7's ``TaskId``)."""

    model_config = ConfigDict(extra="allow")
    task_id: TaskId


def _reason(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "row"
    if err["type"] == "missing":
        return f"missing required field '{key}'"
    return f"{key}: {err['msg']}"


def scan_tasks(
    path: str | Path,
    limit: int | None = None,
    agents: AgentRoute | Collection[str] | None = None,
) -> TaskFileInfo:
    """Validate every line of a task file; raise ``InputError`` naming the file and line. With
    ``agents`` (a route, or the agent names of the config), a row's ``agent_ref`` must name one
    and a materialized row's taskset must be routed."""
    path = Path(path)
    route = agents if isinstance(agents, AgentRoute) or agents is None else AgentRoute(
        frozenset(agents)
    )  # fmt: skip
    # Names alone say nothing of a default: only a run's route refuses a row naming no agent.
    needs_default = isinstance(agents, AgentRoute)
    digest = hashlib.sha256()
    count = 0
    fields: set[str] = set()
    refs: set[str] = set()
    tasksets: set[str] = set()
    ng_tasks: set[int] = set()  # only filled when rows carry NeMo Gym's task index
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
            if is_materialized_row(data):
                taskset, read = _check_materialized(data, route, where)
                tasksets.add(taskset)
                fields.update(read)
            else:
                ref = _check_flat(data, route, where, needs_default)
                if ref is not None:
                    refs.add(ref)
                fields.update(data)
            if NG_TASK_INDEX in data:
                _check_ng_task(data[NG_TASK_INDEX], ng_tasks, where)
            count += 1
    if count == 0:
        raise InputError(f"{path}: no tasks in the file")
    return TaskFileInfo(
        str(path), count, digest.hexdigest(), frozenset(fields), frozenset(refs),
        frozenset(tasksets),
    )  # fmt: skip


def _check_flat(
    data: dict[str, Any], route: AgentRoute | None, where: str, needs_default: bool
) -> str | None:
    """Validate a flat row; its ``agent_ref.name``, if any."""
    try:
        row = TaskRow.model_validate(data)
    except ValidationError as exc:
        raise InputError(f"{where}: {_reason(exc)}") from None
    ref = row.agent_ref
    if route is not None:
        if ref is not None and route.agent_for(ref.name) is None:
            raise InputError(f"{where}: {route.refusal(ref.name)}")
        if ref is None and needs_default and route.agent_for(None) is None:
            raise InputError(f"{where}: {route.no_default()}")
    return None if ref is None else ref.name


def _check_materialized(
    data: dict[str, Any], route: AgentRoute | None, where: str
) -> tuple[str, set[str]]:
    """Validate a materialized row: its taskset, and the row fields it gives an agent (none
    for an environment server, whose task input is its own)."""
    try:
        task_id = _Materialized.model_validate(data).task_id
    except ValidationError as exc:
        raise InputError(f"{where}: {_reason(exc)}") from None
    if not isinstance(data[TASK_INPUT], dict):
        raise InputError(f"{where}: {TASK_INPUT} must be a JSON object")
    for key in (CREATE_PARAMS, "agent_ref"):
        if key in data:
            raise InputError(
                f"{where}: a materialized row ({TASK_ID} + {TASK_INPUT}) has no top-level {key}: "
                f"its create params are in {TASK_INPUT}, its server is its {TASKSET}'s route"
            )
    server = None if route is None else route.server_for_taskset(task_id.taskset)
    if route is not None and server is None:
        raise InputError(f"{where}: {route.taskset_refusal(task_id.taskset)}")
    if route is not None and server in route.environments:
        return task_id.taskset, set()
    # Sent to an agent as a flat row: it must be one (0.7 refuses the same task inputs).
    try:
        flat = flat_row(data)
    except InvalidRequest as exc:
        raise InputError(f"{where}: {TASK_INPUT}: {exc.message}") from None
    try:
        TaskRow.model_validate(flat)
    except ValidationError as exc:
        raise InputError(f"{where}: {TASK_INPUT}: {_reason(exc)}") from None
    return task_id.taskset, set(flat)


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


def materialize(source: str | Path, dest: Path, repeats: int, limit: int | None = None) -> int:
    """Write ``tasks.jsonl``: every task ``repeats`` times, stamped with its indices in both
    spellings; return the rollout count."""
    total = 0
    tmp = dest.with_suffix(".jsonl.tmp")
    with tmp.open("wb") as out:
        for task_index, row in enumerate(iter_tasks(source, limit)):
            row.pop("task_index", None)
            row.pop("rollout_index", None)
            row.pop(NG_ROLLOUT_INDEX, None)
            if is_materialized_row(row):
                row.pop(NG_ROLLOUT_ID, None)  # one per rollout: the run makes its own
                row.pop(NG_ATTEMPT_INDEX, None)
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
