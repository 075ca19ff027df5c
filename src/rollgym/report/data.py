"""A run directory read for a report: one streaming pass over its ledger into flat columns.

Works on any run directory: finished, aborted, resumed or still being written (a torn last
line is skipped; ``metrics.json`` may be missing or from an earlier session, and is only used
for the counters no record holds: HTTP retries, breaker rejections, circuit holds).

A masked rollout (``mask_sample: true``: its reward is no measurement) is counted apart, in
``masked``: it is no scored rollout, so its reward is in no statistic, its task's pass rate or
pass@k; its timings are kept (it ran).
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollgym.collect.layout import METRICS, RUN_JSON, RunDir
from rollgym.collect.metrics import pass_at_ks
from rollgym.collect.rundir import read_state
from rollgym.errors import RollgymError, root_record
from rollgym.nemo_gym.mask import is_masked
from rollgym.server.agent import TIMING_FIELD

HOPS = ("seed", "model", "tool", "verify")
"""The hops an agent times (``rollgym.server.agent.Hops``), in the order a rollout makes them."""


@dataclass
class Failure:
    task_index: int
    type: str
    server: str
    status: str
    attempts: int
    at: float | None
    """Wall-clock time it was recorded (``finished_at``), when the record has one."""


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


@dataclass
class RunData:
    """What a report needs of one run."""

    path: Path
    name: str
    status: str
    total: int
    repeats: int
    threshold: float
    rewards: array[float] = field(default_factory=lambda: array("d"))
    """The reward of each scored (measured) rollout."""
    masked: int = 0
    """Rollouts recorded with ``mask_sample: true``: no reward to count."""
    durations: array[float] = field(default_factory=lambda: array("d"))
    """Seconds of each recorded rollout as the collector saw it (the rollout's whole time)."""
    ends: array[float] = field(default_factory=lambda: array("d"))
    """Wall-clock end of each recorded rollout that has one."""
    attempts: Counter[int] = field(default_factory=Counter)
    hops: dict[str, array[float]] = field(default_factory=dict)
    hop_retries: Counter[str] = field(default_factory=Counter)
    wait_s: float = 0.0
    timed: int = 0
    """Recorded rollouts that carry per-hop timing (runs made before it have none)."""
    failures: list[Failure] = field(default_factory=list)
    tasks: dict[int, TaskStats] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> int:
        return len(self.rewards)

    @property
    def pending(self) -> int:
        return max(0, self.total - self.scored - self.masked - len(self.failures))

    def pass_at(self) -> dict[int, float]:
        """Unbiased pass@k for every k up to the most rollouts scored on a task."""
        return pass_at_ks((t.scored, t.passed) for t in self.tasks.values())

    def reward_mean(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


def load_run(path: Path, name: str | None = None) -> RunData:
    """Read the run in ``path``."""
    files = RunDir(path)
    info = files.read_json(RUN_JSON)
    if not files.tasks.exists() and not info:
        raise RollgymError(f"{path}: not a run directory (no run.json or tasks.jsonl)")
    state = read_state(path)
    inputs = info.get("inputs") or {}
    collect = info.get("collect") or {}
    run = RunData(
        path=path,
        name=name or path.name,
        status=state.status if state else "unknown",
        total=int(info.get("total") or 0),
        repeats=int(inputs.get("repeats") or collect.get("repeats") or 1),
        threshold=float(collect.get("pass_threshold", 1.0)),
        metrics=files.read_json(METRICS),
    )
    for hop in HOPS:
        run.hops[hop] = array("d")
    _read_rollouts(run, files)
    _read_failures(run, files)
    run.total = max(run.total, run.scored + run.masked + len(run.failures))
    return run


def _read_rollouts(run: RunData, files: RunDir) -> None:
    threshold = run.threshold
    for got in files.successes():
        rec = got.record
        run.durations.append(float(rec.get("duration_s", 0.0)))
        run.attempts[int(rec.get("attempts", 1))] += 1
        task = run.tasks.get(rec["task_index"])
        if task is None:
            task = run.tasks[rec["task_index"]] = TaskStats()
        if is_masked(rec):
            run.masked += 1
            task.masked += 1
        else:
            reward = float(rec.get("reward", 0.0))
            run.rewards.append(reward)
            task.scored += 1
            task.passed += reward >= threshold
            task.reward_sum += reward
        timing = rec.get(TIMING_FIELD)
        end = rec.get("finished_at")
        if isinstance(timing, dict):
            run.timed += 1
            for hop in HOPS:
                seconds = timing.get(hop)
                if isinstance(seconds, list):
                    run.hops[hop].extend(float(s) for s in seconds)
            retries = timing.get("retries")
            if isinstance(retries, dict):
                run.hop_retries.update({str(k): int(v) for k, v in retries.items()})
            run.wait_s += float(timing.get("wait_s") or 0.0)
            if end is None:
                end = timing.get("end")
        if isinstance(end, (int, float)):
            run.ends.append(float(end))


def _read_failures(run: RunData, files: RunDir) -> None:
    for got in files.failed():
        rec = got.record
        err = rec.get("error")
        root = root_record(err) if isinstance(err, dict) else {}
        kind = str(root.get("type") or "?")
        status = str(root["status"]) if root.get("status") else kind
        at = rec.get("finished_at")
        run.failures.append(
            Failure(
                task_index=rec["task_index"],
                type=kind,
                server=str(root.get("server") or "?"),
                status=status,
                attempts=int(rec.get("attempts", 1)),
                at=float(at) if isinstance(at, (int, float)) else None,
            )
        )
        task = run.tasks.get(rec["task_index"])
        if task is None:
            task = run.tasks[rec["task_index"]] = TaskStats()
        task.failed += 1
