"""The run being re-verified: its ledger, read once and indexed by rollout, and its tasks
written out as the input of the reverify run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.layout import (
    LINE_LIMIT,
    RunDir,
    Tolerance,
    is_record,
    open_run_file,
    raw_lines,
    read_ledger,
)
from rollgym.errors import ConfigError, InputError
from rollgym.wire import NG_ROLLOUT_INDEX

_LEDGER_KEYS = ("task_index", "rollout_index", NG_ROLLOUT_INDEX)
_NO_RECORD: dict[str, Any] = {}


class RecordedRun:
    """The ledger of the run being re-verified, indexed by rollout: the byte offset of each
    success (read again when its turn comes: a run's responses can be gigabytes) and each
    failure record (with ``failure_records=False``, each failure's key only, mapped to ``{}``:
    a reader that needs no error keeps no record per failure). Read once; a torn last line (a
    run still writing) is skipped. ``tolerance``: what a line that is no record does
    (``Tolerance``; ``TORN_LAST``, replay's: an error naming it, so no rollout is silently left
    out; ``warnings`` hears of a torn last line skipped)."""

    def __init__(
        self,
        out_dir: Path,
        *,
        failure_records: bool = True,
        tolerance: Tolerance = Tolerance.SKIP,
        warnings: list[str] | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.files = RunDir(out_dir)
        self.succeeded: dict[tuple[int, int], int] = {}
        self.failed: dict[tuple[int, int], dict[str, Any]] = {}
        for got in read_ledger(self.files.rollouts, tolerance, warnings):
            self.succeeded.setdefault(got.key, got.offset)
        for got in read_ledger(self.files.failures, tolerance, warnings):
            if "error" in got.record:
                self.failed[got.key] = got.record if failure_records else _NO_RECORD
        self._fh = open_run_file(self.files.rollouts) if self.succeeded else None

    def record(self, key: tuple[int, int]) -> dict[str, Any] | None:
        """The recorded rollout ``key`` (its line of ``rollouts.jsonl``), if it succeeded."""
        offset = self.succeeded.get(key)
        if offset is None or self._fh is None:
            return None
        self._fh.seek(offset)
        line = self._fh.readline(LINE_LIMIT + 1)  # it was within the limit when indexed
        return None if not is_record(line) else orjson.loads(line)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def write_input(source: Path, dest: Path) -> int:
    """Write ``source``'s tasks (its ``tasks.jsonl``, one line per task, indices dropped but
    ``_ng_task_index``) to ``dest``; return the repeats. The same ``source`` always gives the
    same bytes, so ``--resume`` finds the input of the run it resumes."""
    tasks = RunDir(source).tasks
    fh = open_run_file(tasks)
    if fh is None:
        raise ConfigError(f"{source}: not a run directory (no tasks.jsonl)")
    repeats = 0
    seen: set[int] = set()
    tmp = dest.with_suffix(".tmp")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with fh, tmp.open("wb") as out:
        for got in raw_lines(fh):
            line = got.raw
            if line is None:
                raise InputError(got.too_long(tasks))
            if not line.strip():
                continue
            row = orjson.loads(line)
            repeats = max(repeats, int(row["rollout_index"]) + 1)
            if row["task_index"] in seen:
                continue
            seen.add(row["task_index"])
            for key in _LEDGER_KEYS:
                row.pop(key, None)
            out.write(orjson.dumps(row) + b"\n")
    tmp.replace(dest)
    return repeats
