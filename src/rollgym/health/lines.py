"""The lines of a run's JSONL files, streamed: one record at a time, its file and line known.

A run killed mid-write leaves at most one torn line, the last one, without its newline: that
line is skipped with a warning (``--resume`` repairs it the same way). Any other line that is
no record (not JSON, not an object, indices that are not non-negative integers) makes the file
unreadable: ``InputError`` naming the file and the line, because a health verdict over a
ledger with a hole in the middle would be a guess.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.layout import open_run_file, raw_lines
from rollgym.errors import InputError

_SHOWN = 120
"""Characters of a bad line quoted in its error."""


# Not frozen: a frozen dataclass is built 3x slower, and one is built per line.
@dataclass(slots=True)
class Line:
    """One record of a JSONL file: where it is, and the parsed object."""

    path: Path
    lineno: int
    record: dict[str, Any]

    @property
    def key(self) -> tuple[int, int]:
        return (self.record["task_index"], self.record["rollout_index"])


def is_index(value: object) -> bool:
    """A task or rollout index: a non-negative integer (``True`` is no index)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_lines(path: Path, warnings: list[str]) -> Iterator[Line]:
    """The records of ``path`` (none if it does not exist), blank lines skipped; a torn last
    line is skipped and said in ``warnings``. A link, a file that is no regular file, or a line
    past ``LINE_LIMIT`` (never read whole) is an ``InputError`` naming it."""
    fh = open_run_file(path)
    if fh is None:
        return
    with fh:
        lineno = 0
        try:
            for got in raw_lines(fh):
                lineno, raw = got.lineno, got.raw
                if raw is None:
                    raise InputError(got.too_long(path))
                if not raw.strip():
                    continue
                record, problem = _parse(raw)
                if record is not None:
                    yield Line(path, lineno, record)
                elif not raw.endswith(b"\n"):
                    # Only the very last line of a file can lack its newline: a torn write.
                    warnings.append(
                        f"{path}:{lineno}: torn last line skipped ({len(raw)} bytes, no newline:"
                        " the run was stopped mid-write)"
                    )
                else:
                    raise InputError(f"{path}:{lineno}: {problem}: {_shown(raw)}")
        except OSError as exc:
            raise InputError(f"{path}:{lineno + 1}: cannot be read: {exc}") from None


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
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


def _value(value: object) -> str:
    try:
        return orjson.dumps(value).decode()[:40]
    except TypeError:  # pragma: no cover (orjson parsed it, so it dumps)
        return type(value).__name__


def _shown(raw: bytes) -> str:
    text = raw.strip().decode("utf-8", "replace")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")
