"""A run directory read for a report: one streaming pass over its ledger into flat columns.

Works on any run directory: finished, aborted, resumed or still being written (a torn last
line is skipped; ``metrics.json`` may be missing or from an earlier session, and is only used
for the counters no record holds: HTTP retries, breaker rejections, circuit holds).

A masked rollout (``mask_sample: true``: its reward is no measurement) is counted apart, in
``masked``: it is no scored rollout, so its reward is in no statistic, its task's pass rate or
pass@k; its timings are kept (it ran).

Each record's integrity verdict (``rollgym.audit.scan``) is counted in ``integrity``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollgym.collect.layout import METRICS, RUN_JSON, RunDir, open_run_file
from rollgym.collect.metrics import CauseCounts, IntegrityCounts, TaskTable, pass_at_ks
from rollgym.collect.rundir import read_state
from rollgym.errors import RollgymError, root_cause, root_record
from rollgym.protocol import is_masked
from rollgym.report.sample import OTHER, Sample, count_capped, finite
from rollgym.server.agent import TIMING_FIELD

HOPS = ("seed", "model", "tool", "verify")
"""The hops an agent times (``rollgym.server.agent.Hops``), in the order a rollout makes them."""
FAILURE_KEYS = ("root", "type", "server", "status")


@dataclass
class TaskStats:
    scored: int = 0
    passed: int = 0
    failed: int = 0
    masked: int = 0
    reward_sum: float = 0.0

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.scored if self.scored else None


class Tasks:
    """Per task: its records counted in flat arrays (``collect.metrics.TaskTable``), for the
    task indices below ``bound``: the rows of ``tasks.jsonl`` (a run has no more tasks than
    rollouts). A record naming another task (no index, or one past it) is counted in
    ``beyond`` only, so a hand-made ledger cannot make the table grow past the run's shape."""

    def __init__(self, bound: int) -> None:
        self.table = TaskTable(0)
        self.bound = bound
        self.beyond = 0

    def slot(self, index: object) -> int | None:
        """The table's slot for a record of task ``index`` (None: counted in ``beyond``)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.bound:
            self.beyond += 1
            return None
        self.table.ensure(index)
        return index

    def __getitem__(self, index: int) -> TaskStats:
        if index not in self:
            raise KeyError(index)
        t = self.table
        return TaskStats(t.n[index], t.passed[index], t.failed[index], t.masked[index],
                         t.reward_sum[index])  # fmt: skip

    def __contains__(self, index: object) -> bool:
        t = self.table
        return (
            isinstance(index, int)
            and 0 <= index < len(t)
            and bool(t.n[index] or t.failed[index] or t.masked[index])
        )

    def items(self) -> Iterator[tuple[int, TaskStats]]:
        """Every task with a record, in index order."""
        for index in range(len(self.table)):
            if index in self:
                yield index, self[index]

    def values(self) -> Iterator[TaskStats]:
        return (stats for _, stats in self.items())

    def __iter__(self) -> Iterator[int]:
        return (index for index, _ in self.items())


@dataclass
class Failures:
    """A run's failed rollouts, counted: by root cause (``causes``: with the context that ended
    them), type, server and status (``count_capped``), and the wall-clock time of those that
    have one (``finished_at``)."""

    count: int = 0
    causes: CauseCounts = field(default_factory=CauseCounts)
    by_type: Counter[str] = field(default_factory=Counter)
    by_server: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    at: Sample = field(default_factory=Sample)

    def __len__(self) -> int:
        return self.count

    def by(self, key: str) -> Counter[str]:
        """Failures by ``key``: one of ``FAILURE_KEYS``."""
        return {
            "root": self.causes.total, "type": self.by_type, "server": self.by_server,
            "status": self.by_status,
        }[key]  # fmt: skip


@dataclass
class RunData:
    """What a report needs of one run, in memory that does not grow with its records: sums
    and counters, a ``Sample`` per distribution, a few numbers per task."""

    path: Path
    name: str
    status: str
    total: int
    repeats: int
    threshold: float
    tasks: Tasks
    rewards: Sample = field(default_factory=Sample)
    """The reward of each scored (measured) rollout."""
    masked: int = 0
    """Rollouts recorded with ``mask_sample: true``: no reward to count."""
    durations: Sample = field(default_factory=Sample)
    """Seconds of each recorded rollout as the collector saw it (the rollout's whole time)."""
    ends: Sample = field(default_factory=Sample)
    """Wall-clock end of each recorded rollout that has one."""
    retried: int = 0
    """Recorded rollouts that took more than one attempt."""
    hops: dict[str, Sample] = field(default_factory=lambda: {hop: Sample() for hop in HOPS})
    hop_retries: Counter[str] = field(default_factory=Counter)
    wait_s: float = 0.0
    timed: int = 0
    """Recorded rollouts that carry per-hop timing (runs made before it have none)."""
    failures: Failures = field(default_factory=Failures)
    integrity: IntegrityCounts = field(default_factory=IntegrityCounts)
    """Recorded rollouts by integrity verdict."""
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> int:
        return self.rewards.count

    @property
    def pending(self) -> int:
        return max(0, self.total - self.scored - self.masked - self.failures.count)

    def pass_at(self) -> dict[int, float]:
        """Unbiased pass@k for every k up to the most rollouts scored on a task."""
        table = self.tasks.table
        return pass_at_ks(zip(table.n, table.passed, strict=True))

    def reward_mean(self) -> float | None:
        return self.rewards.mean()


def load_run(path: Path, name: str | None = None) -> RunData:
    """Read the run in ``path``: one pass over each ledger file, none of it kept."""
    files = RunDir(path)
    info = files.read_json(RUN_JSON)
    rows = _rows(files)
    if rows is None and not info:
        raise RollgymError(f"{path}: not a run directory (no run.json or tasks.jsonl)")
    state = read_state(path)
    inputs = info.get("inputs") or {}
    collect = info.get("collect") or {}
    run = RunData(
        path=path,
        name=name or path.name,
        status=state.status if state else "unknown",
        total=int(finite(info.get("total")) or 0),
        repeats=int(finite(inputs.get("repeats")) or finite(collect.get("repeats")) or 1),
        threshold=_or(finite(collect.get("pass_threshold", 1.0)), 1.0),
        tasks=Tasks(rows or 0),
        metrics=files.read_json(METRICS),
    )
    _read_rollouts(run, files)
    _read_failures(run, files)
    run.total = max(run.total, run.scored + run.masked + run.failures.count)
    return run


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _rows(files: RunDir) -> int | None:
    """The lines of ``tasks.jsonl`` (an upper bound on the run's tasks), counted without
    parsing; None if it is missing."""
    fh = open_run_file(files.tasks)
    if fh is None:
        return None
    rows, last = 0, b"\n"
    with fh:
        while chunk := fh.read(1 << 20):
            rows += chunk.count(b"\n")
            last = chunk[-1:]
    return rows + (last != b"\n")


def _read_rollouts(run: RunData, files: RunDir) -> None:
    threshold = run.threshold
    for got in files.successes():
        rec = got.record
        _add(run.durations, rec.get("duration_s", 0.0))
        attempts = rec.get("attempts", 1)
        run.retried += isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 1
        run.integrity.add(rec)
        slot = run.tasks.slot(rec["task_index"])
        table = run.tasks.table
        if is_masked(rec):
            run.masked += 1
            if slot is not None:
                table.masked[slot] += 1
        else:
            reward = _or(finite(rec.get("reward", 0.0)), 0.0)
            run.rewards.add(reward)
            if slot is not None:
                table.n[slot] += 1
                table.passed[slot] += reward >= threshold
                table.reward_sum[slot] += reward
        timing = rec.get(TIMING_FIELD)
        end = rec.get("finished_at")
        if isinstance(timing, dict):
            _add_timing(run, timing)
            if end is None:
                end = timing.get("end")
        _add(run.ends, end)


def _add_timing(run: RunData, timing: dict[str, Any]) -> None:
    run.timed += 1
    for hop in HOPS:
        seconds = timing.get(hop)
        if isinstance(seconds, list):
            for value in seconds:
                _add(run.hops[hop], value)
    retries = timing.get("retries")
    if isinstance(retries, dict):
        for hop in HOPS:  # only the hops an agent times: a record's keys are not trusted
            count = retries.get(hop)
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                run.hop_retries[hop] += count
    run.wait_s += finite(timing.get("wait_s")) or 0.0


def _add(sample: Sample, value: object) -> None:
    number = finite(value)
    if number is not None:
        sample.add(number)


def _read_failures(run: RunData, files: RunDir) -> None:
    failures = run.failures
    for got in files.failed():
        rec = got.record
        err = rec.get("error")
        root = root_record(err) if isinstance(err, dict) else {}
        kind = str(root.get("type") or "?")
        failures.count += 1
        count_capped(failures.by_type, kind)
        cause = root_cause(err) if isinstance(err, dict) else None
        cause_type = cause.type if cause is not None else "?"
        count_capped(failures.causes.total, cause_type)
        if cause is not None and cause.context is not None:
            # Contexts come from a fixed set; the cause is whatever key its count went to.
            key = cause_type if cause_type in failures.causes.total else OTHER
            failures.causes.context.setdefault(key, Counter())[cause.context] += 1
        count_capped(failures.by_server, str(root.get("server") or "?"))
        count_capped(failures.by_status, str(root["status"]) if root.get("status") else kind)
        _add(failures.at, rec.get("finished_at"))
        slot = run.tasks.slot(rec["task_index"])
        if slot is not None:
            run.tasks.table.failed[slot] += 1
