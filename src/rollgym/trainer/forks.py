"""``fork(record, k, config=...)``: continuations of one recorded rollout from its turn ``k``.

The first ``k`` turns are replayed from the record (the model's outputs served as recorded, the
environment's tools called again, so a stateful environment is where the rollout was), then the
live model of ``config`` takes over; each continuation is verified and returned. It is
``rollgym replay --fork-at k`` on one rollout (``rollgym.replay``): the config's servers are
started for the call and stopped after it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson

from rollgym import runtime
from rollgym.collect.layout import RunDir
from rollgym.collect.records import ScoredRollout
from rollgym.config import Config
from rollgym.errors import ConfigError
from rollgym.replay import ReplayReport, replay
from rollgym.wire import INDEX_FIELDS

RESULT_FIELDS = frozenset(
    {"response", "reward", "rollgym_timing", "num_steps", "truncated", "agent_seconds",
     "attempts", "duration_s", "finished_at", "step_rewards", "terminated", "info",
     "integrity"} | INDEX_FIELDS
)  # fmt: skip
"""Fields of a record that the rollout made, not its task row (the row given by default is
the record without them)."""


async def fork(
    record: ScoredRollout | dict[str, Any],
    k: int,
    *,
    config: Config,
    row: dict[str, Any] | None = None,
    n: int = 1,
    output: Path | None = None,
) -> tuple[list[dict[str, Any]], ReplayReport]:
    """``n`` continuations of ``record`` (a ``ScoredRollout`` or a line of ``rollouts.jsonl``)
    from its turn ``k`` with ``config``'s live model; ``row``: its task row (default: the record
    without the fields a rollout adds). Returns the new records (each naming its parent and
    ``k`` in ``rollgym_parent``; a continuation that failed is its failure record) and the
    report, whose entries say whether the first ``k`` turns were reproduced exactly. Written
    to ``output`` (default: a temporary directory, removed)."""
    if n < 1:
        raise ConfigError(f"fork: n={n}: must be at least 1")
    verified = record.verified if isinstance(record, ScoredRollout) else record
    if not isinstance(verified.get("response"), dict):
        raise ConfigError("fork: the record has no 'response': only a verified rollout forks")
    task = (
        row if row is not None else {k2: v for k2, v in verified.items() if k2 not in RESULT_FIELDS}
    )
    if output is not None:
        return await _fork_into(verified, task, k, config, n, output)
    with tempfile.TemporaryDirectory(prefix="rollgym-fork-") as tmp:
        return await _fork_into(verified, task, k, config, n, Path(tmp))


async def _fork_into(
    verified: dict[str, Any], task: dict[str, Any], k: int, config: Config, n: int, where: Path
) -> tuple[list[dict[str, Any]], ReplayReport]:
    source = where / "parent"
    files = RunDir(source)
    source.mkdir(parents=True, exist_ok=True)
    indices = {"task_index": 0, "rollout_index": 0}
    files.tasks.write_bytes(orjson.dumps({**task, **indices}) + b"\n")
    files.rollouts.write_bytes(orjson.dumps({**verified, **indices}) + b"\n")
    out = where / "fork"
    _, report = await replay(source, out, config=config, fork_at=k, copies=n, progress=False)
    done = RunDir(out)
    records = {got.key: got.record for got in done.successes()}
    records.update({got.key: got.record for got in done.failed() if got.key not in records})
    # A fork's entries (n of them) held: the directory may be a temporary one, removed next.
    return [records[key] for key in sorted(records)], report.hold()


def fork_sync(
    record: ScoredRollout | dict[str, Any], k: int, **options: Any
) -> tuple[list[dict[str, Any]], ReplayReport]:
    """``fork`` for callers without an event loop."""
    return runtime.run(fork(record, k, **options))
