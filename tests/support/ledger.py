"""Reading a run's output directory, and the ledger invariant of DESIGN.md."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson

Record = dict[str, Any]


def read_jsonl(path: Path) -> list[Record]:
    """The records of a JSON-lines file; none if it does not exist."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def keys(records: list[Record]) -> list[tuple[int, int]]:
    return [(r["task_index"], r["rollout_index"]) for r in records]


def assert_recorded_once(out: Path) -> tuple[list[Record], list[Record]]:
    """No rollout is recorded twice (as two successes, two failures or one of each), and every
    record is a rollout of tasks.jsonl; holds after an aborted run too. Return (rollouts,
    failures)."""
    expected = keys(read_jsonl(out / "tasks.jsonl"))
    assert expected, "tasks.jsonl is empty"
    assert len(set(expected)) == len(expected)
    rollouts = read_jsonl(out / "rollouts.jsonl")
    failures = read_jsonl(out / "failures.jsonl")
    seen = Counter(keys(rollouts) + keys(failures))
    dupes = {k: n for k, n in seen.items() if n > 1}
    assert not dupes, f"recorded more than once: {dupes}"
    unknown = set(seen) - set(expected)
    assert not unknown, f"unknown: {sorted(unknown)[:10]}"
    return rollouts, failures


def assert_ledger_invariant(out: Path) -> tuple[list[Record], list[Record]]:
    """Every (task_index, rollout_index) of tasks.jsonl has exactly one record in rollouts.jsonl
    or failures.jsonl; return (rollouts, failures)."""
    rollouts, failures = assert_recorded_once(out)
    missing = set(keys(read_jsonl(out / "tasks.jsonl"))) - set(keys(rollouts) + keys(failures))
    assert not missing, f"missing: {sorted(missing)[:10]}"
    return rollouts, failures


def ledger_counts(out: Path) -> tuple[int, int]:
    """``assert_ledger_invariant``, counted: (succeeded, failed)."""
    rollouts, failures = assert_ledger_invariant(out)
    return len(rollouts), len(failures)


def error_chain(error: Record) -> list[Record]:
    """An error record and its origins, outermost first."""
    chain = [error]
    while isinstance(chain[-1].get("origin"), dict):
        chain.append(chain[-1]["origin"])
    return chain
