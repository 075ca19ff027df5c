"""What a replay runs: the recorded rollouts it takes (all, ``--rollouts IDS`` or a seeded
``--sample N``), each as one task row of the replay's input and one entry of its plan.

The replay is a run of its own: row ``i`` of ``OUT/input.jsonl`` is the recorded rollout's task
row, so the replay's rollout ``i:0`` replays it; the row names its parent (``rollgym_parent``:
the run, the rollout, the fork's turn), so every record of the replay's ledger says what it
replays. ``OUT/replay_plan.jsonl`` (line ``i``) holds what the replay model serves to rollout
``i:0``: the model items of each recorded turn, and the recorded response around them.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.tasks import iter_rollouts
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
        if key not in keys:
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
    recorded: RecordedRun, keys: list[Key], output: Path, fork_at: int | None
) -> list[PlanEntry]:
    """Write the replay's input rows and plan for ``keys`` into ``output``; return the plan."""
    rows: dict[Key, bytes] = {}
    wanted = set(keys)
    for task, rollout, raw in iter_rollouts(recorded.files.tasks):
        if (task, rollout) in wanted:
            rows[(task, rollout)] = raw
    output.mkdir(parents=True, exist_ok=True)
    plan: list[PlanEntry] = []
    with (output / INPUT_FILE).open("wb") as inp, (output / PLAN_FILE).open("wb") as out:
        for i, key in enumerate(keys):
            record = recorded.record(key)
            if record is None or key not in rows:
                raise ConfigError(
                    f"{recorded.out_dir}: rollout {key_text(key)} has no readable record or row"
                )
            row = {k: v for k, v in orjson.loads(rows[key]).items() if k not in INDEX_FIELDS}
            row[PARENT_FIELD] = {
                "run": str(recorded.out_dir), "rollout": key_text(key), "fork_at": fork_at,
            }  # fmt: skip
            inp.write(orjson.dumps(row) + b"\n")
            entry = PlanEntry.of(f"{i}:0", key_text(key), record, fork_at)
            out.write(entry.to_line())
            plan.append(entry)
    return plan


def read_plan(path: Path) -> list[PlanEntry]:
    """The plan ``write_plan`` wrote (the replay model's option ``plan``)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the replay plan: {exc.strerror or exc}") from None
    return [PlanEntry(**orjson.loads(line)) for line in lines if line.strip()]
