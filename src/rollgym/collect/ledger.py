"""The ledger: ``rollouts.jsonl`` + ``failures.jsonl``, one record per rollout, resumable.

Each record is written and flushed the moment its rollout finishes, so a killed run keeps what it
finished. On resume, recorded successes are never redone; failures with attempts left are taken
out of ``failures.jsonl`` (kept in ``failures.history.jsonl``) and dispatched again, so that after
a completed run every rollout of ``tasks.jsonl`` has exactly one record.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from rollgym.collect.layout import RunDir, Tolerance, is_record, read_ledger
from rollgym.collect.records import RolloutRecord
from rollgym.errors import EnvironmentFailure
from rollgym.wire import TERMINAL

log = logging.getLogger("rollgym.collect")


def _repair_tail(path: Path) -> None:
    """Make a file whose last line has no newline (a run killed mid-write) whole JSONL again:
    a complete record just gets its newline, a torn one is cut off (its rollout is redone)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
        return  # a link, a FIFO...: refused by read_ledger (``open_run_file``), never opened
    with path.open("rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        start = _last_line_start(fh, size)
        fh.seek(start)
        tail = fh.read(size - start)
        if is_record(tail):
            # Killed between the record and its newline: the record is whole, keep it, or a
            # recorded success would be redone.
            fh.seek(size)
            fh.write(b"\n")
            return
        fh.truncate(start)
        log.warning("%s: dropped a torn last line left by an interrupted run", path)


def _last_line_start(fh: IO[bytes], size: int) -> int:
    """Offset just past the last newline before ``size`` (0 when there is none)."""
    pos, chunk = size, 4096
    while pos > 0:
        start = max(0, pos - chunk)
        fh.seek(start)
        idx = fh.read(pos - start).rfind(b"\n")
        if idx >= 0:
            return start + idx + 1
        pos = start
    return 0


class Ledger:
    """Where rollouts are recorded. ``repeats`` maps (task, rollout) to a slot in a bitmap."""

    def __init__(self, out_dir: Path, total: int, repeats: int) -> None:
        self.out_dir = out_dir
        self.total = total
        self.repeats = repeats
        files = RunDir(out_dir)
        self.rollouts_path = files.rollouts
        self.failures_path = files.failures
        self.history_path = files.failures_history
        self._done = bytearray(total)  # 1 = success recorded, 2 = final failure recorded
        self.prior_attempts: dict[int, int] = {}
        self.succeeded = 0
        self.failed = 0
        self._ok: IO[bytes] | None = None
        self._bad: IO[bytes] | None = None
        self.stamp: Callable[[RolloutRecord], dict[str, Any] | None] | None = None
        """The fields the run adds to each line (``rollgym.collect.spend``), asked once per
        record written."""

    def slot(self, task_index: int, rollout_index: int) -> int:
        return task_index * self.repeats + rollout_index

    def load(self, max_attempts: int) -> None:
        """Read existing records (resume): successes stay done; failures with attempts left are
        moved to the history file and become pending again."""
        for path in (self.rollouts_path, self.failures_path):
            _repair_tail(path)
        for got in read_ledger(self.rollouts_path, Tolerance.STRICT):
            slot = self.slot(*got.key)
            if self._done[slot] != 1:
                self._done[slot] = 1
                self.succeeded += 1
        # Attempts of failures already moved out by an earlier resume: that resume may have
        # died before recording anything, and its count must not start again from 0.
        for got in read_ledger(self.history_path, Tolerance.STRICT):
            slot = self.slot(*got.key)
            if not self._done[slot]:
                attempts = int(got.record.get("attempts", 1))
                self.prior_attempts[slot] = max(self.prior_attempts.get(slot, 0), attempts)
        if not self.failures_path.exists():
            return
        keep: list[bytes] = []
        retry: list[bytes] = []
        for got in read_ledger(self.failures_path, Tolerance.STRICT):
            line, rec = got.raw, got.record
            slot = self.slot(*got.key)
            if self._done[slot]:
                retry.append(line)  # superseded (a success, or a duplicate): history only
                continue
            attempts = int(rec.get("attempts", 1))
            if attempts >= max_attempts or _said_final(rec):
                self._done[slot] = 2
                self.failed += 1
                keep.append(line)
            else:
                self.prior_attempts[slot] = max(self.prior_attempts.get(slot, 0), attempts)
                retry.append(line)
        if retry:
            with self.history_path.open("ab") as hist:
                hist.writelines(retry)
                hist.flush()
                os.fsync(hist.fileno())
        tmp = self.failures_path.with_suffix(".jsonl.tmp")
        with tmp.open("wb") as fh:
            fh.writelines(keep)
            fh.flush()
            os.fsync(fh.fileno())  # durable before it replaces the only copy of those records
        tmp.replace(self.failures_path)

    def is_done(self, task_index: int, rollout_index: int) -> bool:
        return self._done[self.slot(task_index, rollout_index)] != 0

    def attempts_so_far(self, task_index: int, rollout_index: int) -> int:
        return self.prior_attempts.get(self.slot(task_index, rollout_index), 0)

    @property
    def pending(self) -> int:
        return self.total - self.succeeded - self.failed

    def open(self) -> None:
        self._ok = self.rollouts_path.open("ab")
        self._bad = self.failures_path.open("ab")

    def add(self, record: RolloutRecord) -> bool:
        """Write ``record`` and flush it; False (nothing written) if its rollout already has
        one (a late duplicate)."""
        slot = self.slot(record.task_index, record.rollout_index)
        if self._done[slot]:
            log.warning(
                "duplicate record for %s:%s dropped", record.task_index, record.rollout_index
            )
            return False
        fh = self._ok if record.ok else self._bad
        assert fh is not None, "open() first"
        extra = self.stamp(record) if self.stamp is not None else None
        fh.write(record.to_json(extra) + b"\n")
        fh.flush()
        if record.ok:
            self._done[slot] = 1
            self.succeeded += 1
        else:
            self._done[slot] = 2
            self.failed += 1
        return True

    def close(self) -> None:
        for fh in (self._ok, self._bad):
            if fh is not None and not fh.closed:
                fh.flush()
                os.fsync(fh.fileno())
                fh.close()


def _said_final(record: dict[str, object]) -> bool:
    """Whether a failure is an environment's own ``terminal: true`` (``EnvironmentFailure``):
    it said the rollout must not be tried again, so ``--resume`` does not. rollgym's own errors
    keep the attempts rule: their retry judgement is the policy's."""
    error = record.get("error")
    return (
        isinstance(error, dict)
        and error.get("type") == EnvironmentFailure.type
        and error.get(TERMINAL) is True
    )
