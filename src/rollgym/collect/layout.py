"""The run directory's files, named once, and the one reader of its ledger.

    OUT/
      tasks.jsonl                      the materialized inputs (repeats expanded, indices)
      rollouts.jsonl, failures.jsonl   the ledger: one record per rollout
      stale.jsonl                      a stream's stale outcomes (``rollgym.stream``)
      failures.history.jsonl           failures superseded on --resume
      metrics.json, per_task.jsonl     the run's metrics
      rollouts_aggregate_metrics.json  the environment's /aggregate_metrics (NeMo Gym's file)
      run.json, run.lock, logs/        how the run went, its lock, the servers' logs

``RunDir`` is what every reader and writer of a run directory uses (the collector, the ledger,
metrics, ``reverify``, ``report``): a file's name is spelt here only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson

from rollgym.errors import InputError

TASKS = "tasks.jsonl"
ROLLOUTS = "rollouts.jsonl"
FAILURES = "failures.jsonl"
FAILURES_HISTORY = "failures.history.jsonl"
STALE = "stale.jsonl"
METRICS = "metrics.json"
PER_TASK = "per_task.jsonl"
AGGREGATE = "rollouts_aggregate_metrics.json"
RUN_JSON = "run.json"
LOCK = "run.lock"
LOGS = "logs"


@dataclass(frozen=True)
class RunDir:
    """The files of the run directory ``root``."""

    root: Path

    OWN_FILES: ClassVar[tuple[str, ...]] = (
        RUN_JSON, TASKS, ROLLOUTS, FAILURES, FAILURES_HISTORY, METRICS, PER_TASK, AGGREGATE,
        LOCK, LOGS,
    )  # fmt: skip
    """What a run writes in its directory."""

    @property
    def tasks(self) -> Path:
        return self.root / TASKS

    @property
    def rollouts(self) -> Path:
        return self.root / ROLLOUTS

    @property
    def failures(self) -> Path:
        return self.root / FAILURES

    @property
    def stale(self) -> Path:
        return self.root / STALE

    @property
    def failures_history(self) -> Path:
        return self.root / FAILURES_HISTORY

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def per_task(self) -> Path:
        return self.root / PER_TASK

    @property
    def aggregate(self) -> Path:
        return self.root / AGGREGATE

    @property
    def run_json(self) -> Path:
        return self.root / RUN_JSON

    @property
    def lock(self) -> Path:
        return self.root / LOCK

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    def successes(self) -> Iterator[LedgerLine]:
        """The records of ``rollouts.jsonl`` (none if it is missing); see ``read_ledger``."""
        return read_ledger(self.rollouts)

    def failed(self) -> Iterator[LedgerLine]:
        """The records of ``failures.jsonl`` (none if it is missing); see ``read_ledger``."""
        return read_ledger(self.failures)

    def read_json(self, name: str) -> dict[str, Any]:
        """The JSON object in file ``name`` of the directory; ``{}`` if it is missing or not
        one (a run that never wrote it, a file being replaced)."""
        try:
            data = orjson.loads((self.root / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}


@dataclass(frozen=True, slots=True)
class LedgerLine:
    """One record of a ledger file: where it starts, its bytes, and the record."""

    offset: int
    raw: bytes
    record: dict[str, Any]

    @property
    def key(self) -> tuple[int, int]:
        return (self.record["task_index"], self.record["rollout_index"])


def is_record(raw: bytes) -> bool:
    """Whether ``raw`` is a whole ledger record (a JSON object with both indices)."""
    return _parse(raw) is not None


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    ok = isinstance(rec, dict) and "task_index" in rec and "rollout_index" in rec
    return rec if ok else None


def read_ledger(path: Path, *, strict: bool = False) -> Iterator[LedgerLine]:
    """Every record of the ledger file ``path`` (none if it is missing), blank lines skipped.

    A reader of a run that may still be writing (a report, ``reverify``, metrics) skips a line
    that is no record: only the last one can be torn by a kill. ``strict`` (the ledger itself,
    on ``--resume``, once that last line is repaired) raises ``InputError`` naming the line."""
    if not path.exists():
        return
    with path.open("rb") as fh:
        offset = 0
        for lineno, line in enumerate(fh, start=1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            rec = _parse(line)
            if rec is None:
                if strict:
                    raise InputError(f"{path}:{lineno}: {_why_not(line)}")
                continue
            yield LedgerLine(start, line, rec)


def _why_not(line: bytes) -> str:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"corrupt ledger record: {exc}"
    return "ledger record without task/rollout index"
