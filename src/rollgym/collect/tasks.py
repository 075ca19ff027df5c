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
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from rollgym.config import CollectConfig, Config
from rollgym.errors import InputError
from rollgym.protocol import TaskRow
from rollgym.wire import NG_ROLLOUT_INDEX, NG_TASK_INDEX

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


@dataclass(frozen=True)
class TaskFileInfo:
    path: str
    tasks: int
    sha256: str
    fields: frozenset[str] = frozenset()
    """Every top-level field found in the rows."""
    agent_refs: frozenset[str] = frozenset()
    """Every ``agent_ref.name`` found in the rows."""


@dataclass(frozen=True)
class AgentRoute:
    """Which agent server runs a row: with ``override``, ``default`` runs every row; else the
    row's ``agent_ref.name``, an agent of the config or a foreign name (NeMo Gym's
    ``mcqa_simple_agent``...) that ``aliases`` maps to one; a row naming none goes to
    ``default``."""

    agents: frozenset[str]
    default: str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    override: bool = False

    @classmethod
    def of(cls, config: Config, collect: CollectConfig, default: str | None = None) -> AgentRoute:
        """The route of a run of ``config`` (``default``: the run's agent, else
        ``collect.agent``, else the config's only agent)."""
        agents = frozenset(n for n, s in config.servers.items() if s.kind == "agent")
        if default is None:
            default = collect.agent or (next(iter(agents)) if len(agents) == 1 else None)
        return cls(agents, default, dict(collect.agent_aliases), collect.ignore_agent_ref)

    def agent_for(self, name: Any) -> str | None:
        """The agent server for a row whose ``agent_ref.name`` is ``name``; ``None`` if no
        agent of the run answers to it."""
        if self.override or name is None:
            return self.default
        if name in self.agents:
            return str(name)
        return self.aliases.get(name) if isinstance(name, str) else None

    def refusal(self, name: Any) -> str:
        """Why a row naming ``name`` cannot run, and the ways out."""
        known = ", ".join(sorted(self.agents)) or "none"
        target = self.default or "AGENT"
        return (
            f"agent_ref.name {name!r} is not an agent of the config (agents: {known}); "
            f"run every row with --agent {target}, or map the name in the config: "
            f"collect.agent_aliases: {{{name}: {target}}}"
        )


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
    ``agents`` (a route, or the agent names of the config), a row's ``agent_ref`` must name one.
    """
    path = Path(path)
    route = agents if isinstance(agents, AgentRoute) or agents is None else AgentRoute(
        frozenset(agents)
    )  # fmt: skip
    digest = hashlib.sha256()
    count = 0
    fields: set[str] = set()
    refs: set[str] = set()
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
            ref = row.agent_ref
            if ref is not None:
                if route is not None and route.agent_for(ref.name) is None:
                    raise InputError(f"{path}:{lineno}: {route.refusal(ref.name)}")
                refs.add(ref.name)
            fields.update(data)
            if NG_TASK_INDEX in data:
                _check_ng_task(data[NG_TASK_INDEX], ng_tasks, f"{path}:{lineno}")
            count += 1
    if count == 0:
        raise InputError(f"{path}: no tasks in the file")
    return TaskFileInfo(str(path), count, digest.hexdigest(), frozenset(fields), frozenset(refs))


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
    """(task_index, rollout_index, raw line) of every row of ``tasks.jsonl``."""
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                row = orjson.loads(line)
                yield row["task_index"], row["rollout_index"], line.rstrip(b"\n")
