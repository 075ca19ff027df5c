"""The run directory's files, named once, and the one reader of its ledger.

    OUT/
      tasks.jsonl                      the materialized inputs (repeats expanded, indices)
      rollouts.jsonl, failures.jsonl   the ledger: one record per rollout
      stale.jsonl                      a stream's stale outcomes (``rollgym.trainer.stream``)
      failures.history.jsonl           failures superseded on --resume
      metrics.json, per_task.jsonl     the run's metrics
      rollouts_aggregate_metrics.json  the environment's /aggregate_metrics
      run.json, run.lock, logs/        how the run went, its lock, the servers' logs

``RunDir`` is what every reader and writer of a run directory uses (the collector, the ledger,
metrics, ``reverify``, ``report``): a file's name is spelt here only.

A run directory is input like any other: a file in it may be a link planted by anyone who could
write there (to ``/dev/zero``, to ``/etc/shadow``), a FIFO, or a line of gigabytes. Every reader
opens its files with ``open_run_file`` (no link followed, nothing but a regular file) and reads
lines with ``raw_lines`` (none longer than ``LINE_LIMIT`` is held), so reading a run costs the
same memory however large or hostile it is.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import orjson

from rollgym.config import AnswerLimits
from rollgym.errors import InputError

TASKS = "tasks.jsonl"
ROLLOUTS = "rollouts.jsonl"
FAILURES = "failures.jsonl"
FAILURES_HISTORY = "failures.history.jsonl"
STALE = "stale.jsonl"
METRICS = "metrics.json"
COST = "cost.json"
PER_TASK = "per_task.jsonl"
AGGREGATE = "rollouts_aggregate_metrics.json"
RUN_JSON = "run.json"
LOCK = "run.lock"
LOGS = "logs"

LINE_LIMIT = AnswerLimits().decompressed_bytes + (64 << 10)
"""The longest line read from a run file, newline excluded. A record is the agent's answer
(the collector reads none past ``answer_limits.decompressed_bytes``, 64 MiB by default) plus
the indices and timings it adds; a longer line was written by something else."""
_CHUNK = 64 << 10
"""Run files are read this much at a time; a line past its block is measured before it is
read."""


@dataclass(frozen=True)
class RunDir:
    """The files of the run directory ``root``."""

    root: Path

    OWN_FILES: ClassVar[tuple[str, ...]] = (
        RUN_JSON, TASKS, ROLLOUTS, FAILURES, FAILURES_HISTORY, METRICS, PER_TASK, AGGREGATE,
        LOCK, LOGS, COST,
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
    def cost(self) -> Path:
        return self.root / COST

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
        """The records of ``rollouts.jsonl`` (none if it is missing), any line that is no
        record skipped (``Tolerance.SKIP``)."""
        return read_ledger(self.rollouts)

    def failed(self) -> Iterator[LedgerLine]:
        """The records of ``failures.jsonl`` (none if it is missing), any line that is no
        record skipped (``Tolerance.SKIP``)."""
        return read_ledger(self.failures)

    def read_json(self, name: str) -> dict[str, Any]:
        """The JSON object in file ``name`` of the directory; ``{}`` if it is missing or not
        one (a run that never wrote it, a file being replaced, one past ``LINE_LIMIT``).
        ``InputError`` if it is a link or no regular file (``open_run_file``)."""
        fh = open_run_file(self.root / name)
        if fh is None:
            return {}
        try:
            with fh:
                # Read its size (plus one byte: a file grown since), not LINE_LIMIT: a read of
                # n bytes allocates n first, 64 MiB for a run.json of a few KB.
                size = os.fstat(fh.fileno()).st_size
                raw = fh.read(min(size, LINE_LIMIT) + 1)
            data = orjson.loads(raw) if len(raw) <= LINE_LIMIT else None
        except (OSError, orjson.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}


def open_run_file(path: Path) -> BinaryIO | None:
    """``path``, a file of a run directory, opened to read; None if it does not exist.

    ``InputError`` naming it if it is a symbolic link (never followed: ``O_NOFOLLOW``) or not
    a regular file: a FIFO would block the reader (it is opened ``O_NONBLOCK``, so only the
    check sees it), ``/dev/zero`` would never end."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():  # ELOOP from O_NOFOLLOW (EMLINK on some BSDs)
            # Its folder, then what the file is (``not_followed`` names the file itself).
            raise InputError(f"{path.parent}: {not_followed(path)}") from None
        raise InputError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(
                f"{path}: is {_kind(mode)}, not a regular file; rollgym reads only regular "
                "files in a run directory"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def not_followed(path: Path) -> str:
    """What every reader and writer of a run directory says of a link found in it."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return (
        f"{path.name} is a symbolic link (to {target}); rollgym never reads or writes through "
        "a link in its run directory"
    )


def _kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a device",
             stat.S_ISBLK: "a device", stat.S_ISSOCK: "a socket"}  # fmt: skip
    return next((name for test, name in kinds.items() if test(mode)), "no regular file")


# Not frozen: a frozen dataclass is built 3x slower, and one is built per line.
@dataclass(slots=True)
class RawLine:
    """One line of a run file: its number, where it starts, its bytes (newline included) and
    its size; ``raw`` is None for a line longer than the limit, which is skipped unread."""

    lineno: int
    offset: int
    raw: bytes | None
    size: int

    def too_long(self, path: Path, limit: int = LINE_LIMIT) -> str:
        """The error of an over-long line, naming ``path`` and the line."""
        return (
            f"{path}:{self.lineno}: a line of {self.size} bytes, longer than any record the "
            f"collector writes ({limit} bytes): not read"
        )


def raw_lines(fh: BinaryIO, limit: int = LINE_LIMIT) -> Iterator[RawLine]:
    """The lines of ``fh`` (a regular file: ``open_run_file``), read a block at a time. A line
    is held only if it is at most ``limit`` bytes (newline excluded): one that runs past its
    block is measured first, then read back whole if within the limit, else yielded with
    ``raw=None``, so a 300 MB line costs a block, not 300 MB."""
    lineno = pos = 0  # pos: where the current block starts in the file
    spanning = -1  # where a line that runs past its block starts (-1: none)
    while block := fh.read(_CHUNK):
        start = 0
        while (end := block.find(b"\n", start) + 1) > 0:
            lineno += 1
            if spanning < 0:
                raw = block[start:end] if end - start <= limit + 1 else None
                yield RawLine(lineno, pos + start, raw, end - start)
            else:
                yield _read_back(fh, lineno, spanning, pos + end, limit)
                fh.seek(pos + len(block))
                spanning = -1
            start = end
        if start < len(block) and spanning < 0:
            spanning = pos + start
        pos += len(block)
    if spanning >= 0:  # a last line without its newline
        yield _read_back(fh, lineno + 1, spanning, pos, limit)


def _read_back(fh: BinaryIO, lineno: int, start: int, end: int, limit: int) -> RawLine:
    """The line of ``fh`` from ``start`` to ``end``, read again if it is within ``limit``."""
    size = end - start
    with_newline = size > 0 and _ends_line(fh, end)
    if size - with_newline > limit:
        return RawLine(lineno, start, None, size)
    fh.seek(start)
    return RawLine(lineno, start, fh.read(size), size)


def _ends_line(fh: BinaryIO, end: int) -> bool:
    fh.seek(end - 1)
    return fh.read(1) == b"\n"


class Tolerance(enum.Enum):
    """What ``read_ledger`` does with a line that is no record, named by its caller."""

    SKIP = "skip"
    """Skip it, whatever it is: a reader of a run that may still be writing (a report,
    ``reverify``, metrics), where only the last line can be torn by a kill."""
    STRICT = "strict"
    """Raise ``InputError`` naming the line: the ledger itself, on ``--resume``, once its last
    line is repaired (``rollgym.collect.ledger``)."""
    TORN_LAST = "torn_last"
    """Skip a last line without its newline (a torn write), saying so in the caller's
    ``warnings``; raise ``InputError`` naming any other line, quoting it, and an I/O error as
    one naming the line reached: a verdict over a file with a hole in the middle would be a
    guess (``rollgym health``)."""


# Not frozen: a frozen dataclass is built 3x slower, and one is built per line.
@dataclass(slots=True)
class LedgerLine:
    """One record of a ledger file: its file and line, where it starts, its bytes, and the
    record."""

    path: Path
    lineno: int
    offset: int
    raw: bytes
    record: dict[str, Any]

    @property
    def key(self) -> tuple[int, int]:
        return (self.record["task_index"], self.record["rollout_index"])


def is_index(value: object) -> bool:
    """A task or rollout index: a non-negative integer (``True`` is no index)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_record(raw: bytes) -> bool:
    """Whether ``raw`` is a whole ledger record (a JSON object with both indices)."""
    return _parse(raw)[0] is not None


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """The record in ``raw``, or ``None`` and why it is none: the one rule of what a record is
    (a JSON object whose ``task_index`` and ``rollout_index`` are non-negative integers)."""
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    for name in ("task_index", "rollout_index"):
        if not is_index(record.get(name)):
            return None, f"{name} is {_value(record.get(name))}, not a non-negative integer"
    return record, ""


def read_ledger(
    path: Path, tolerance: Tolerance = Tolerance.SKIP, warnings: list[str] | None = None
) -> Iterator[LedgerLine]:
    """Every record of the JSONL file ``path`` (a ledger file, or ``tasks.jsonl``; none if it
    is missing), blank lines skipped; a line that is no record is skipped or raised as
    ``tolerance`` says. A line past ``LINE_LIMIT`` is such a line, never read whole; a link or
    a file that is no regular file raises ``InputError`` whatever the tolerance
    (``open_run_file``). ``warnings`` (``TORN_LAST``) hears of a torn last line skipped."""
    fh = open_run_file(path)
    if fh is None:
        return
    with fh:
        lineno = 0
        try:
            for got in raw_lines(fh):
                lineno, raw = got.lineno, got.raw
                if raw is None:
                    if tolerance is Tolerance.SKIP:
                        continue
                    raise InputError(got.too_long(path))
                if not raw.strip():
                    continue
                record, problem = _parse(raw)
                if record is not None:
                    yield LedgerLine(path, lineno, got.offset, raw, record)
                elif tolerance is Tolerance.STRICT:
                    raise InputError(f"{path}:{lineno}: corrupt ledger record: {problem}")
                elif tolerance is Tolerance.TORN_LAST:
                    if raw.endswith(b"\n"):
                        raise InputError(f"{path}:{lineno}: {problem}: {_shown(raw)}")
                    # Only the very last line of a file can lack its newline: a torn write.
                    if warnings is not None:
                        warnings.append(
                            f"{path}:{lineno}: torn last line skipped ({len(raw)} bytes, no "
                            "newline: the run was stopped mid-write)"
                        )
        except OSError as exc:
            if tolerance is not Tolerance.TORN_LAST:
                raise
            raise InputError(f"{path}:{lineno + 1}: cannot be read: {exc}") from None


_SHOWN = 120
"""Characters of a bad line quoted in its error."""


def _value(value: object) -> str:
    try:
        return orjson.dumps(value).decode()[:40]
    except TypeError:  # pragma: no cover (orjson parsed it, so it dumps)
        return type(value).__name__


def _shown(raw: bytes) -> str:
    text = raw.strip().decode("utf-8", "replace")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")
