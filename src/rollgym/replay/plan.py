"""What a replay runs: the recorded rollouts it takes (all, ``--rollouts IDS`` or a seeded
``--sample N``), each as one task row of the replay's input and one entry of its plan.

The replay is a run of its own: row ``i`` of ``OUT/input.jsonl`` is the recorded rollout's task
row, so the replay's rollout ``i:0`` replays it; the row names its parent (``rollgym_parent``:
the run, the rollout, the fork's turn), so every record of the replay's ledger says what it
replays. ``OUT/replay_plan.jsonl`` (line ``i``) holds what the replay model serves to rollout
``i:0``: the model items of each recorded turn, and the recorded response around them.

Nothing here holds more than one rollout's record at a time, whatever the run's size: the
recorded run is indexed by byte offset (``RecordedRun``), the rows and records taken are read
one by one by offset and written out at once, and the plan is read back the same way
(``PlanFile``), one entry when it is asked for. What is kept per rollout is its key and
offsets, never its outputs.
"""

from __future__ import annotations

import random
import re
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from rollgym.collect.layout import (
    LINE_LIMIT,
    Tolerance,
    is_record,
    open_run_file,
    raw_lines,
    read_ledger,
)
from rollgym.errors import ConfigError
from rollgym.replay.turns import model_turns, split_turns
from rollgym.reverify.source import RecordedRun
from rollgym.wire import INDEX_FIELDS, PARENT_FIELD

PLAN_FILE = "replay_plan.jsonl"
INPUT_FILE = "input.jsonl"

Key = tuple[int, int]


@dataclass
class PlanEntry:
    """What the replay model serves to one rollout of the replay."""

    rollout: str
    """The replay's rollout id (``i:0``: row ``i`` of its input)."""
    parent: str
    """The recorded rollout it replays (``task_index:rollout_index`` of the source run)."""
    turns: list[list[dict[str, Any]]]
    """The model items of each recorded turn, in order."""
    prompt_turns: int = 0
    """Model turns already in the task's own input (a few-shot prompt): not the rollout's."""
    fork_at: int | None = None
    """From this turn on, the live model answers (``--fork-at``)."""
    shell: dict[str, Any] = field(default_factory=dict)
    """The recorded response without its output: what each served turn is wrapped in."""

    @classmethod
    def of(
        cls, rollout: str, parent: str, record: dict[str, Any], fork_at: int | None
    ) -> PlanEntry:
        got = record.get("response")
        response: dict[str, Any] = got if isinstance(got, dict) else {}
        _, turns = split_turns(response.get("output"))
        params = record.get("responses_create_params") or {}
        prompt = params.get("input") if isinstance(params, dict) else None
        shell = {
            k: v for k, v in response.items()
            if k not in ("output", "usage", "rollgym_upstream")
        }  # fmt: skip
        return cls(rollout, parent, [t.model for t in turns], model_turns(prompt), fork_at, shell)

    def to_line(self) -> bytes:
        return orjson.dumps(asdict(self)) + b"\n"


def key_text(key: Key) -> str:
    return f"{key[0]}:{key[1]}"


def parse_ids(text: str, source: Path, recorded: RecordedRun) -> list[Key]:
    """``--rollouts`` (``TASK:ROLLOUT`` ids, comma-separated) as keys of recorded successes;
    a usage error names an id that is malformed, unknown or failed in the record."""
    keys: list[Key] = []
    seen: set[Key] = set()  # a long --rollouts list is checked in one pass, not quadratically
    for raw in (part.strip() for part in text.split(",")):
        if not raw:
            continue
        task, _, rollout = raw.partition(":")
        if not (task.isdigit() and rollout.isdigit()):
            raise ConfigError(f"--rollouts {raw!r}: expected TASK:ROLLOUT ids such as 3:0")
        key = (int(task), int(rollout))
        if key in recorded.failed:
            raise ConfigError(
                f"--rollouts {raw}: failed in {source}/failures.jsonl; only a verified rollout "
                "can be replayed"
            )
        if key not in recorded.succeeded:
            raise ConfigError(f"--rollouts {raw}: {source}/rollouts.jsonl has no rollout {raw}")
        if key not in seen:
            seen.add(key)
            keys.append(key)
    if not keys:
        raise ConfigError("--rollouts: no rollout ids given (e.g. --rollouts 0:0,3:1)")
    return keys


def select(
    recorded: RecordedRun, source: Path, ids: str | None, sample: int | None, seed: int = 0
) -> list[Key]:
    """The recorded rollouts to replay: ``ids``, else ``sample`` of them drawn with ``seed``
    (in ledger order), else every one recorded as a success."""
    if ids is not None and sample is not None:
        raise ConfigError("--rollouts and --sample: give one of them")
    if ids is not None:
        return parse_ids(ids, source, recorded)
    keys = sorted(recorded.succeeded)
    if sample is not None:
        if sample < 1:
            raise ConfigError(f"--sample {sample}: must be at least 1")
        keys = sorted(random.Random(seed).sample(keys, min(sample, len(keys))))
    if not keys:
        raise ConfigError(f"{source}: no verified rollout to replay (rollouts.jsonl is empty)")
    return keys


def write_plan(
    recorded: RecordedRun,
    keys: list[Key],
    output: Path,
    fork_at: int | None,
    warnings: list[str] | None = None,
) -> None:
    """Write the replay's input rows and plan for ``keys`` into ``output``: one rollout's row
    and record read (by offset), written and dropped at a time. A line of ``tasks.jsonl`` that
    is no row is an error naming it (a torn last line is skipped, told to ``warnings``)."""
    wanted = set(keys)
    rows: dict[Key, int] = {}  # the offset of each row taken in tasks.jsonl
    for got in read_ledger(recorded.files.tasks, Tolerance.TORN_LAST, warnings):
        if got.key in wanted:
            rows.setdefault(got.key, got.offset)
    output.mkdir(parents=True, exist_ok=True)
    tasks = open_run_file(recorded.files.tasks)
    if tasks is None:
        raise ConfigError(f"{recorded.out_dir}: not a run directory (no tasks.jsonl)")
    with tasks, (output / INPUT_FILE).open("wb") as inp, (output / PLAN_FILE).open("wb") as out:
        for i, key in enumerate(keys):
            record = recorded.record(key)
            found = rows.get(key)
            raw = line_at(tasks, found) if found is not None else None
            if record is None or raw is None:
                raise ConfigError(
                    f"{recorded.out_dir}: rollout {key_text(key)} has no readable record or row"
                )
            row = {k: v for k, v in orjson.loads(raw).items() if k not in INDEX_FIELDS}
            row[PARENT_FIELD] = {
                "run": str(recorded.out_dir), "rollout": key_text(key), "fork_at": fork_at,
            }  # fmt: skip
            inp.write(orjson.dumps(row) + b"\n")
            out.write(PlanEntry.of(f"{i}:0", key_text(key), record, fork_at).to_line())


def line_at(fh: BinaryIO, offset: int) -> bytes | None:
    """The ledger record (a JSON object with its indices) that starts at ``offset`` of
    ``fh``, as its bytes; None if none does (it was within ``LINE_LIMIT`` when indexed)."""
    fh.seek(offset)
    line = fh.readline(LINE_LIMIT + 1)
    return line if is_record(line) else None


_ROLLOUT_FIRST = re.compile(rb'\{"rollout":"([^"\\]*)"')
"""How ``PlanEntry.to_line`` begins (``asdict`` keeps the fields' order): the id, read without
parsing the line."""


class PlanFile:
    """The plan ``write_plan`` wrote (the replay model's option ``plan``), indexed by line:
    eight bytes a rollout (where its line starts), and its id only when it is not the line's
    own ``i:0``. An entry is read from the file when it is asked for, so the replay model holds
    the outputs of the rollouts it serves, never the plan's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._starts = array("q")
        self._odd: dict[str, int] = {}  # an id that is not its line's "i:0": its line
        try:
            fh = open_run_file(path)
            if fh is None:
                raise FileNotFoundError(2, "no such file")
            with fh:
                for got in raw_lines(fh):
                    if got.raw is None:
                        raise ConfigError(f"replay plan {got.too_long(path)}")
                    if not got.raw.strip():
                        continue
                    line = len(self._starts)
                    self._starts.append(got.offset)
                    found = _ROLLOUT_FIRST.match(got.raw)
                    rollout = found[1].decode() if found else orjson.loads(got.raw)["rollout"]
                    if rollout != f"{line}:0":
                        self._odd.setdefault(rollout, line)
        except OSError as exc:
            raise ConfigError(
                f"{path}: cannot read the replay plan: {exc.strerror or exc}"
            ) from None

    def __len__(self) -> int:
        return len(self._starts)

    def entry(self, rollout: str) -> PlanEntry | None:
        """Rollout ``rollout``'s entry (``i:0``), read from the file; None if the plan has
        none."""
        line = self._odd.get(rollout)
        if line is None:
            task, _, index = rollout.partition(":")
            if not (task.isdigit() and index == "0"):
                return None
            line = int(task)
        if line >= len(self._starts):
            return None
        # A file of its own per read: entries are read from threads, each seeks its own.
        fh = open_run_file(self.path)
        if fh is None:
            raise ConfigError(f"{self.path}: the replay plan is gone")
        with fh:
            fh.seek(self._starts[line])
            entry = PlanEntry(**orjson.loads(fh.readline(LINE_LIMIT + 1)))
        return entry if entry.rollout == rollout else None
