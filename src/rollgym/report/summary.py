"""The numbers a report leads with, as plain data: for the page's tables and the terminal."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from rollgym.collect.cost_ledger import describe_cost
from rollgym.collect.metrics import CauseCounts, IntegrityCounts
from rollgym.collect.provenance import compare_fingerprints, recorded_fingerprints
from rollgym.report.data import RunData

HARDEST = 15


@dataclass(frozen=True)
class TaskRow:
    task_index: int
    scored: int
    passed: int
    failed: int
    pass_rate: float | None
    reward_mean: float | None
    masked: int = 0


@dataclass(frozen=True)
class Delta:
    task_index: int
    before: float
    after: float

    @property
    def change(self) -> float:
        return self.after - self.before


def hardest(run: RunData, n: int = HARDEST) -> list[TaskRow]:
    """The ``n`` tasks with the lowest pass rate (then the most failed rollouts)."""
    rows = (
        TaskRow(i, t.scored, t.passed, t.failed, t.pass_rate,
                t.reward_sum / t.scored if t.scored else None, t.masked)
        for i, t in run.tasks.items()
    )  # fmt: skip
    # nsmallest keeps n rows, not one per task; it breaks ties by order, as a stable sort does.
    return heapq.nsmallest(
        n, rows, key=lambda r: (r.pass_rate if r.pass_rate is not None else -1.0, -r.failed)
    )


def deltas(base: RunData, other: RunData, n: int = HARDEST) -> list[Delta]:
    """The ``n`` tasks whose pass rate moved most from ``base`` to ``other``."""
    moved = (
        Delta(i, t.pass_rate, o.pass_rate)
        for i, t in base.tasks.items()
        if i in other.tasks
        and t.pass_rate is not None
        and (o := other.tasks[i]).pass_rate is not None
        and o.pass_rate != t.pass_rate
    )
    return heapq.nsmallest(n, moved, key=lambda d: (-abs(d.change), d.task_index))


def headline(run: RunData) -> dict[str, str]:
    """One run in a few labelled values."""
    mean = run.reward_mean()
    curve = run.pass_at()
    kmax = max(curve, default=0)
    hops = {h: run.hops[h].values for h in run.hops if len(run.hops[h])}
    masked = f", {run.masked} masked" if run.masked else ""
    return {
        "status": run.status,
        "rollouts": f"{run.scored} ok{masked}, {run.failures.count} failed, {run.pending} pending "
        f"of {run.total}",
        "reward mean": "-" if mean is None else f"{mean:.4f}",
        "pass@1": f"{curve[1]:.4f}" if curve else "-",
        f"pass@{kmax}": f"{curve[kmax]:.4f}" if kmax > 1 else "-",
        "failures": run.failures.causes.describe(limit=3) or "none",
        "integrity": tagged(run.integrity),
        "hop p50 (ms)": ", ".join(f"{h} {_median(v) * 1000:.1f}" for h, v in hops.items())
        or "no per-hop timing",
        "cost": describe_cost(cost) if isinstance(cost := run.metrics.get("cost"), dict) else "-",
        "environments": fingerprints(run),
    }


def fingerprints(run: RunData) -> str:
    """``env 3d44a5986cf6``: each environment's fingerprint id, as ``run.json`` recorded it."""
    found = recorded_fingerprints(run.path)
    return ", ".join(f"{n} {p.get('id') or 'unknown'}" for n, p in sorted(found.items())) or "-"


def provenance(runs: list[RunData]) -> list[str]:
    """For a comparison: where each run was scored by other environments than the first."""
    said: list[str] = []
    for other in runs[1:]:
        differ = compare_fingerprints(runs[0].path, other.path)
        if differ:
            said.extend(differ)
        elif recorded_fingerprints(runs[0].path):
            said.append(f"{runs[0].name} and {other.name}: scored by the same environments")
    return said


def tagged(counts: IntegrityCounts) -> str:
    """``3 tagged of 96 (3.1%): 1 exploit, 2 suspect``: the rollouts tagged by their integrity
    verdict (``rollgym.audit.scan``)."""
    rate = counts.rate()
    if rate is None:
        return "no verdicts"
    kinds = ", ".join(
        f"{counts.verdicts[v]} {v}" for v in ("exploit", "suspect") if counts.verdicts[v]
    )
    masked = f", {counts.masked} masked" if counts.masked else ""
    return f"{counts.tagged} tagged of {counts.rollouts} ({rate:.1%})" + (
        f": {kinds}{masked}" if kinds else ""
    )


ENV_HEADER = ("environment", "ok", "failed", "reward mean", "pass@1", "failures", "tagged")


def environments(run: RunData) -> list[tuple[str, ...]]:
    """One row per environment of a run that covers several (``metrics.json``'s
    ``by_environment``, written by the collector, which knows each row's environment)."""
    by_env = run.metrics.get("by_environment")
    if not isinstance(by_env, dict):
        return []
    integrity = run.metrics.get("integrity")
    verdicts = integrity.get("by_environment") if isinstance(integrity, dict) else None
    verdicts = verdicts if isinstance(verdicts, dict) else {}
    rows: list[tuple[str, ...]] = []
    for name, env in sorted(by_env.items()):
        if not isinstance(env, dict):
            continue
        mean = (env.get("reward") or {}).get("mean")
        p1 = (env.get("pass_at_k") or {}).get("pass@1")
        by_root = env.get("failures_by_root")
        failures = CauseCounts.of(
            {"by_root": by_root, "by_root_context": env.get("failures_by_root_context")}
            if isinstance(by_root, dict)
            else {"by_type": env.get("failures_by_type") or {}}
        )
        rows.append(
            (
                str(name),
                str(env.get("succeeded", 0)),
                str(env.get("failed", 0)),
                "-" if mean is None else f"{mean:.4f}",
                "-" if p1 is None else f"{p1:.4f}",
                failures.describe() or "none",
                _tagged_share(verdicts.get(name)),
            )
        )
    return rows


def _tagged_share(counts: Any) -> str:
    """An environment's tagged share, from ``metrics.json``'s ``integrity.by_environment``."""
    rate = counts.get("rate") if isinstance(counts, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        return "-"
    return f"{rate:.1%} of {counts.get('rollouts')}"


def _median(values: object) -> float:
    ordered = sorted(values)  # type: ignore[call-overload]
    return float(ordered[len(ordered) // 2]) if ordered else 0.0


def terminal(runs: list[RunData]) -> str:
    """A short plain-text summary of every run, and of the per-task deltas when comparing."""
    lines = []
    for run in runs:
        lines.append(f"{run.name} ({run.path})")
        lines.extend(f"  {k}: {v}" for k, v in headline(run).items() if v != "-")
        for env in environments(run):
            lines.append(
                "  " + " | ".join(f"{h}: {v}" for h, v in zip(ENV_HEADER, env, strict=True))
            )
        worst = [r for r in hardest(run, 5) if r.pass_rate is not None]
        if worst:
            shown = ", ".join(f"{r.task_index} ({r.pass_rate:.2f})" for r in worst)
            lines.append(f"  hardest tasks (pass rate): {shown}")
    lines.extend(provenance(runs))
    for other in runs[1:]:
        moved = deltas(runs[0], other, 5)
        if moved:
            shown = ", ".join(f"{d.task_index} {d.before:.2f}->{d.after:.2f}" for d in moved)
            lines.append(f"largest per-task changes, {runs[0].name} -> {other.name}: {shown}")
    return "\n".join(lines)
