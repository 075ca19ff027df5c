"""What re-verifying changed: the rollouts whose reward changed, by task, and both runs' reward
metrics (pass@k as ``rollgym.collect.metrics`` computes it) over the rollouts scored in both."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollgym.collect.layout import RunDir
from rollgym.collect.metrics import pass_at_ks
from rollgym.errors import root_record

DIFF_FILE = "reverify_diff.json"


@dataclass
class RewardChange:
    task_index: int
    rollout_index: int
    before: float
    after: float | None
    """None: the rollout now failed (its error type is in ``error``)."""
    error: str | None = None


@dataclass
class ReverifyDiff:
    """What re-verifying changed: rollouts whose reward changed (by task), and reward metrics
    of both runs over the rollouts scored in both."""

    source: str
    output: str
    compared: int = 0
    changed: list[RewardChange] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)

    def by_task(self) -> dict[int, list[RewardChange]]:
        out: dict[int, list[RewardChange]] = {}
        for change in self.changed:
            out.setdefault(change.task_index, []).append(change)
        return out

    def to_dict(self) -> dict[str, Any]:
        by_task = {
            str(task): [_change(c) for c in changes]
            for task, changes in sorted(self.by_task().items())
        }
        return {
            "source": self.source,
            "output": self.output,
            "compared": self.compared,
            "changed": len(self.changed),
            "by_task": by_task,
            "metrics_before": self.before,
            "metrics_after": self.after,
        }


def _change(change: RewardChange) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rollout_index": change.rollout_index, "before": change.before, "after": change.after,
    }  # fmt: skip
    if change.error:
        out["error"] = change.error
    return out


def _rewards(out_dir: Path) -> dict[tuple[int, int], float]:
    return {got.key: float(got.record["reward"]) for got in RunDir(out_dir).successes()}


def _reward_metrics(
    rewards: list[tuple[tuple[int, int], float]], threshold: float
) -> dict[str, Any]:
    if not rewards:
        return {"scored": 0, "reward_mean": None, "pass_at_k": {}}
    tasks: dict[int, list[float]] = {}
    for (task, _), reward in rewards:
        tasks.setdefault(task, []).append(reward)
    passes = pass_at_ks((len(v), sum(r >= threshold for r in v)) for v in tasks.values())
    return {
        "scored": len(rewards),
        "reward_mean": sum(r for _, r in rewards) / len(rewards),
        "pass_at_k": {f"pass@{k}": value for k, value in passes.items()},
    }


def diff_runs(source: Path, output: Path, threshold: float = 1.0) -> ReverifyDiff:
    """Compare ``output`` (a reverify of ``source``) with ``source``: every rollout scored in
    ``source`` whose reward differs (or that failed on re-verifying), and both runs' reward
    metrics over the rollouts scored in both."""
    before, after = _rewards(source), _rewards(output)
    errors = {got.key: root_record(got.record["error"])["type"] for got in RunDir(output).failed()}
    diff = ReverifyDiff(str(source), str(output))
    both = sorted(k for k in before if k in after)
    diff.compared = len(both)
    for key in sorted(before):
        if key in after and after[key] != before[key]:
            diff.changed.append(RewardChange(*key, before[key], after[key]))
        elif key not in after and key in errors:
            diff.changed.append(RewardChange(*key, before[key], None, errors[key]))
    diff.before = _reward_metrics([(k, before[k]) for k in both], threshold)
    diff.after = _reward_metrics([(k, after[k]) for k in both], threshold)
    return diff
