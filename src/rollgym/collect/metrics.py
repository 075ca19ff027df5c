"""Metrics of a run, computed by streaming the ledger files (never all in memory at once).

pass@k uses the unbiased estimator of Chen et al. (2021): for a task with n scored rollouts of
which c pass, pass@k = 1 - C(n-c, k) / C(n, k); averaged over tasks with n >= k. Failed rollouts
are not scored (a failure is never a reward of 0), so they lower n, not c.

Masked rollouts (``mask_sample: true``: the environment says the reward is no measurement) are
recorded successes, counted in ``succeeded``, but like failures they lower n, not c, and are left
out of the reward mean/std, the environment's metrics and the sub-scores: they measure nothing.
``coverage`` says how much was measured:
``measured_rollouts``, ``masked_rollouts``, ``measured_tasks`` (tasks with a measured rollout),
``fully_masked_tasks`` (tasks with recorded rollouts, none measured). The agent's own fields and
token drift still cover every recorded rollout: they describe the agent's loop, which ran.

Agent fields: the numbers an agent adds to the verified rollout about its own loop
(``AGENT_FIELDS``: steps, seconds, re-tokenisation drift) are averaged apart from the
environment's metrics, in ``agent_fields``: they describe the agent, not the environment.

Per environment: with ``groups`` (each task's environment, from the collector, which knows
which agent runs each row and which resources server that agent verifies with), a run that
covers more than one environment also gets ``by_environment``: each one's counts, reward
mean/std, pass@k and failures by type, computed from the same records in the same pass.

Integrity: each record's verdict (``rollgym.audit.scan``, on its line since the recorder
tagged it) is counted in ``integrity``: clean, suspect, exploit, masked (by
``collect.mask_exploits``), the tagged share (``rate``: suspect or exploit), the classes of the
reasons, and the same per environment (``by_environment``) when the run covers more than one.
Records written before the verdicts existed are not counted (``rollouts`` is those with one).

Sub-scores: a verify response may carry ``scores``, an object of named numbers besides the
reward (``{"tests": 0.5, "style": 1.0}``); each is aggregated as its mean and its pass rate
(the share of rollouts where it reaches the run's pass threshold), over the rollouts that
report it.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollgym.audit.scan import FIELD, VERDICTS, verdict_of
from rollgym.collect.layout import RunDir, open_run_file, raw_lines
from rollgym.errors import root_cause, root_record
from rollgym.models.tokens import DRIFTED_TURNS
from rollgym.protocol import is_masked
from rollgym.wire import FAILURE_KIND, INDEX_FIELDS

AGENT_FIELDS = frozenset(
    {"num_steps", "agent_seconds", DRIFTED_TURNS, "env_steps", "session_attempts"}
)
"""Numbers the agents add to a verified rollout about their own loop, not the environment's."""

_NOT_METRICS = INDEX_FIELDS | {"reward", "attempts", "duration_s", "finished_at"}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with ``n`` samples of which ``c`` passed."""
    if k > n:
        raise ValueError(f"k={k} exceeds n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_ks(tasks: Iterable[tuple[int, int]], up_to: int = 0) -> dict[int, float]:
    """pass@k over ``tasks`` of (n scored, c passed), for every k from 1 to the larger of
    ``up_to`` and the most rollouts scored on one task: the mean over the tasks with n >= k (a
    k that no task reaches is left out)."""
    counts = [(n, c) for n, c in tasks if n > 0]
    out: dict[int, float] = {}
    for k in range(1, max(up_to, max((n for n, _ in counts), default=0)) + 1):
        values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
        if values:
            out[k] = sum(values) / len(values)
    return out


class TaskTable:
    """Per-task counters as flat arrays indexed by task: a few bytes per task, where a dict of
    objects would cost a few hundred (and a run can hold millions of tasks). Also what
    ``rollgym report`` counts a run's tasks in."""

    def __init__(self, tasks: int) -> None:
        self.n = array("l", bytes(8 * tasks))
        self.passed = array("l", bytes(8 * tasks))
        self.failed = array("l", bytes(8 * tasks))
        self.masked = array("l", bytes(8 * tasks))
        self.reward_sum = array("d", bytes(8 * tasks))

    def ensure(self, index: int) -> None:
        missing = index + 1 - len(self.n)
        if missing > 0:  # a record beyond tasks.jsonl's count (hand-made files): grow
            for column in (self.n, self.passed, self.failed, self.masked):
                column.extend([0] * missing)
            self.reward_sum.extend([0.0] * missing)

    def __len__(self) -> int:
        return len(self.n)


@dataclass
class ScoreStats:
    """One named sub-score over a run."""

    mean: float
    pass_rate: float
    count: int


class _ScoreSums:
    def __init__(self) -> None:
        self.sum: dict[str, float] = {}
        self.passed: Counter[str] = Counter()
        self.count: Counter[str] = Counter()

    def add(self, scores: Any, threshold: float) -> None:
        if not isinstance(scores, dict):
            return
        for name, value in scores.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.sum[name] = self.sum.get(name, 0.0) + value
                self.passed[name] += value >= threshold
                self.count[name] += 1

    def stats(self) -> dict[str, ScoreStats]:
        return {
            name: ScoreStats(
                mean=self.sum[name] / self.count[name],
                pass_rate=self.passed[name] / self.count[name],
                count=self.count[name],
            )
            for name in sorted(self.sum)
        }


@dataclass
class TokenDrift:
    """Re-tokenisation drift over the rollouts that carried token data (``drifted_turns``)."""

    checked_rollouts: int = 0
    drifted_rollouts: int = 0
    drifted_turns: int = 0


@dataclass
class Coverage:
    """How much of a run its reward statistics were computed from (``/aggregate_metrics``'s
    ``coverage/*`` too)."""

    measured_rollouts: int = 0
    masked_rollouts: int = 0
    measured_tasks: int = 0
    fully_masked_tasks: int = 0


class CauseCounts:
    """Failures by root cause, and per cause by the context that ended them
    (``rollgym.errors.root_cause``): ``replica_down 180 (circuit_open 120, budget_exhausted
    20)``. The one tally behind ``metrics.json``'s ``by_root``, ``run.json``'s abort summary,
    ``rollgym health`` and ``rollgym report``."""

    def __init__(self) -> None:
        self.total: Counter[str] = Counter()
        self.context: dict[str, Counter[str]] = {}

    @classmethod
    def of(cls, failures: dict[str, Any]) -> CauseCounts:
        """The counts of a ``failures`` section (``metrics.json``'s, ``run.json``'s abort):
        its ``by_root`` and ``by_root_context``, else (written before them) ``by_type``."""
        counts = cls()
        by_root = failures.get("by_root")
        if not isinstance(by_root, dict):
            by_root = failures.get("by_type") or {}
        contexts = failures.get("by_root_context") or {}
        for cause, n in by_root.items():
            counts.total[str(cause)] += int(n)
        for cause, ends in contexts.items():
            if isinstance(ends, dict):
                counts.context[str(cause)] = Counter({str(c): int(k) for c, k in ends.items()})
        return counts

    def add(self, cause: str, context: str | None, n: int = 1) -> None:
        self.total[cause] += n
        if context is not None:
            self.context.setdefault(cause, Counter())[context] += n

    def totals(self) -> dict[str, int]:
        """Cause -> failures, most frequent first."""
        return dict(self.total.most_common())

    def contexts(self) -> dict[str, dict[str, int]]:
        """Cause -> {context -> failures}, for the causes with any, in the order of ``totals``."""
        return {
            cause: dict(self.context[cause].most_common())
            for cause in self.totals()
            if cause in self.context
        }

    def describe(self, limit: int | None = None) -> str:
        """``replica_down 180 (circuit_open 120, budget_exhausted 20), connect_error 3``; the
        first ``limit`` causes and how many more."""
        parts = []
        causes = list(self.totals().items())
        for cause, n in causes[:limit]:
            ends = self.context.get(cause)
            beside = ", ".join(f"{c} {k}" for c, k in ends.most_common()) if ends else ""
            parts.append(f"{cause} {n}" + (f" ({beside})" if beside else ""))
        more = len(causes) - len(parts)
        return ", ".join(parts) + (f" +{more} more" if more > 0 else "")


class IntegrityCounts:
    """Rollouts by integrity verdict (``rollgym.audit.scan``), read from their lines: the one
    tally behind ``metrics.json``'s ``integrity``, ``rollgym health``'s ``integrity_tagged``
    and ``rollgym report``."""

    def __init__(self) -> None:
        self.verdicts: Counter[str] = Counter()
        self.masked = 0
        self.by_class: Counter[str] = Counter()

    @property
    def rollouts(self) -> int:
        """Rollouts with a verdict."""
        return sum(self.verdicts.values())

    @property
    def tagged(self) -> int:
        return self.rollouts - self.verdicts["clean"]

    def rate(self) -> float | None:
        """The tagged share (suspect or exploit); None when no rollout has a verdict."""
        return self.tagged / self.rollouts if self.rollouts else None

    def add(self, record: dict[str, Any]) -> str | None:
        """Count ``record``'s verdict; the verdict (None: it has none)."""
        verdict = verdict_of(record)
        if verdict is None:
            return None
        self.verdicts[verdict] += 1
        found = record[FIELD]
        self.masked += found.get("masked") is True
        reasons = found.get("reasons")
        for reason in reasons[:20] if isinstance(reasons, list) else ():
            if isinstance(reason, str):
                self.by_class[reason.partition(":")[0][:40]] += 1
        return verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            **{v: self.verdicts[v] for v in VERDICTS},
            "masked": self.masked,
            "rate": self.rate(),
            "by_class": dict(self.by_class.most_common(20)),
        }


class _Group:
    """One environment's share of a run (``by_environment``)."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.masked = 0
        self.failed: Counter[str] = Counter()
        self.causes = CauseCounts()

    def add(self, reward: float) -> None:
        self.count += 1
        delta = reward - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (reward - self.mean)

    def to_dict(self, tasks: TaskTable, members: list[int], repeats: int) -> dict[str, Any]:
        curve = pass_at_ks(((tasks.n[i], tasks.passed[i]) for i in members), repeats)
        return {
            "tasks": len(members),
            "succeeded": self.count + self.masked,
            "failed": sum(self.failed.values()),
            "masked": self.masked,
            "reward": {
                "mean": self.mean if self.count else None,
                "std": math.sqrt(self.m2 / self.count) if self.count else None,
            },
            "pass_at_k": {f"pass@{k}": v for k, v in curve.items()},
            "failures_by_type": dict(self.failed),
            "failures_by_root": self.causes.totals(),
            "failures_by_root_context": self.causes.contexts(),
        }


@dataclass
class RunMetrics:
    total: int
    succeeded: int = 0
    """Rollouts recorded in ``rollouts.jsonl``, masked ones included."""
    failed: int = 0
    masked: int = 0
    reward_mean: float | None = None
    reward_std: float | None = None
    pass_at_k: dict[str, float] = field(default_factory=dict)
    failures_by_type: dict[str, int] = field(default_factory=dict)
    failures_by_server: dict[str, int] = field(default_factory=dict)
    failures_by_status: dict[str, int] = field(default_factory=dict)
    failures_by_kind: dict[str, int] = field(default_factory=dict)
    """By the ``failure_kind`` a line carries (its row dialect's, when it says one)."""
    failures_by_root: dict[str, int] = field(default_factory=dict)
    """By root cause (``rollgym.errors.root_cause``), most frequent first."""
    failures_by_root_context: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per root cause, the deadline, budget or breaker that ended its failures (those that
    had one)."""
    env_metrics: dict[str, float] = field(default_factory=dict)
    agent_fields: dict[str, float] = field(default_factory=dict)
    """Means of ``AGENT_FIELDS`` over the rollouts that carry them."""
    scores: dict[str, ScoreStats] = field(default_factory=dict)
    token_drift: TokenDrift | None = None
    coverage: Coverage = field(default_factory=Coverage)
    integrity: dict[str, Any] = field(default_factory=dict)
    """Rollouts by integrity verdict, and per environment (see the module docstring)."""
    by_environment: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per environment, when the run covers more than one (see the module docstring)."""

    def to_dict(self) -> dict[str, Any]:
        extra = {"by_environment": self.by_environment} if self.by_environment else {}
        return {
            "counts": {
                "total": self.total,
                "succeeded": self.succeeded,
                "failed": self.failed,
                "pending": self.total - self.succeeded - self.failed,
            },
            "reward": {"mean": self.reward_mean, "std": self.reward_std},
            "coverage": vars(self.coverage),
            "pass_at_k": self.pass_at_k,
            "failures": {
                "by_type": self.failures_by_type,
                "by_server": self.failures_by_server,
                "by_status": self.failures_by_status,
                "by_kind": self.failures_by_kind,
                "by_root": self.failures_by_root,
                "by_root_context": self.failures_by_root_context,
            },
            "env_metrics": self.env_metrics,
            "agent_fields": self.agent_fields,
            "scores": {name: vars(stats) for name, stats in self.scores.items()},
            "token_drift": vars(self.token_drift) if self.token_drift else None,
            "integrity": self.integrity,
            **extra,
        }


def _row_keys(tasks: Path) -> frozenset[str]:
    """The top-level keys of the run's task rows that hold numbers. Read as the ledger is
    (``open_run_file``, lines within ``LINE_LIMIT``); a line that is no row is skipped, as
    ``read_ledger`` skips one: ``rollgym health`` names it."""
    keys: set[str] = set()
    fh = open_run_file(tasks)
    if fh is None:
        return frozenset()
    with fh:
        for got in raw_lines(fh):
            try:
                row = orjson.loads(got.raw) if got.raw is not None and got.raw.strip() else None
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict):
                keys.update(
                    k for k, v in row.items() if isinstance(v, (int, float)) and k not in keys
                )
    return frozenset(keys)


def compute_metrics(
    out_dir: Path,
    total: int,
    repeats: int,
    threshold: float = 1.0,
    groups: Sequence[str] | None = None,
) -> RunMetrics:
    """Metrics over ``rollouts.jsonl`` and ``failures.jsonl``; writes ``per_task.jsonl``.
    ``groups``: the environment of each task (by task index), for ``by_environment``."""
    tasks = TaskTable(total // max(1, repeats))
    m = RunMetrics(total=total)
    names = sorted(set(groups or ()))
    split = len(names) > 1
    per_env: dict[str, _Group] = {g: _Group() for g in names} if split else {}

    def group(index: int) -> _Group | None:
        return per_env[groups[index]] if split and groups and index < len(groups) else None

    count, mean, m2 = 0, 0.0, 0.0  # Welford: numerically stable streaming mean/variance
    metric_sums: dict[str, float] = {}
    metric_counts: Counter[str] = Counter()
    agent_sums: dict[str, float] = {}
    agent_counts: Counter[str] = Counter()
    sub_scores = _ScoreSums()
    drift = TokenDrift()
    integrity = IntegrityCounts()
    integrity_by_env: dict[str, IntegrityCounts] = {}
    # A verify response echoes its task row: the row's own numbers (a secret, a difficulty)
    # are task data, not metrics of the environment.
    files = RunDir(out_dir)
    skip = _NOT_METRICS | _row_keys(files.tasks)
    for got in files.successes():
        rec = got.record
        i = rec["task_index"]
        tasks.ensure(i)
        turns = rec.get(DRIFTED_TURNS)
        if isinstance(turns, int) and not isinstance(turns, bool):
            drift.checked_rollouts += 1
            drift.drifted_rollouts += turns > 0
            drift.drifted_turns += turns
        masked = is_masked(rec)
        if integrity.add(rec) is not None and groups and i < len(groups):
            integrity_by_env.setdefault(groups[i], IntegrityCounts()).add(rec)
        for key, value in rec.items():
            if key in skip or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if key in AGENT_FIELDS:
                agent_sums[key] = agent_sums.get(key, 0.0) + value
                agent_counts[key] += 1
            elif not masked:
                metric_sums[key] = metric_sums.get(key, 0.0) + value
                metric_counts[key] += 1
        env = group(i)
        if masked:
            m.masked += 1
            tasks.masked[i] += 1
            if env is not None:
                env.masked += 1
            continue
        reward = float(rec["reward"])
        if env is not None:
            env.add(reward)
        tasks.n[i] += 1
        tasks.reward_sum[i] += reward
        tasks.passed[i] += reward >= threshold
        count += 1
        delta = reward - mean
        mean += delta / count
        m2 += delta * (reward - mean)
        sub_scores.add(rec.get("scores"), threshold)
    m.succeeded = count + m.masked
    measured_tasks = sum(1 for n in tasks.n if n)
    m.coverage = Coverage(
        measured_rollouts=count,
        masked_rollouts=m.masked,
        measured_tasks=measured_tasks,
        fully_masked_tasks=sum(
            1 for n, k in zip(tasks.n, tasks.masked, strict=True) if k and not n
        ),
    )
    if count:
        m.reward_mean = mean
        m.reward_std = math.sqrt(m2 / count)
    by_type: Counter[str] = Counter()
    by_server: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    causes = CauseCounts()
    for got in files.failed():
        rec = got.record
        m.failed += 1
        tasks.ensure(rec["task_index"])
        tasks.failed[rec["task_index"]] += 1
        # Attributed to the server where it started.
        err = root_record(rec.get("error") or {})
        by_type[str(err.get("type"))] += 1
        by_server[str(err.get("server"))] += 1
        by_status[str(err.get("status") if err.get("status") is not None else err.get("type"))] += 1
        if isinstance(kind := rec.get(FAILURE_KIND), str):  # a line its dialect classed
            by_kind[kind] += 1
        cause = root_cause(rec.get("error") or {})
        causes.add(cause.type, cause.context)
        env = group(rec["task_index"])
        if env is not None:
            env.failed[str(err.get("type"))] += 1
            env.causes.add(cause.type, cause.context)
    m.failures_by_type = dict(by_type)
    m.failures_by_kind = dict(by_kind)
    m.failures_by_server = dict(by_server)
    m.failures_by_status = dict(by_status)
    m.failures_by_root = causes.totals()
    m.failures_by_root_context = causes.contexts()
    passes = pass_at_ks(zip(tasks.n, tasks.passed, strict=True), repeats)
    m.pass_at_k = {f"pass@{k}": value for k, value in passes.items()}
    m.env_metrics = {k: metric_sums[k] / metric_counts[k] for k in sorted(metric_sums)}
    m.agent_fields = {k: agent_sums[k] / agent_counts[k] for k in sorted(agent_sums)}
    m.scores = sub_scores.stats()
    m.token_drift = drift if drift.checked_rollouts else None
    m.integrity = integrity.to_dict()
    if integrity_by_env:
        m.integrity["by_environment"] = {
            name: counts.to_dict() for name, counts in sorted(integrity_by_env.items())
        }
    if split and groups is not None:
        members: dict[str, list[int]] = {g: [] for g in per_env}
        for index, name in enumerate(groups):
            members[name].append(index)
        m.by_environment = {
            name: env.to_dict(tasks, [i for i in members[name] if i < len(tasks)], repeats)
            for name, env in per_env.items()
        }
    with files.per_task.open("wb") as fh:
        for index in range(len(tasks)):
            n, passed, failed = tasks.n[index], tasks.passed[index], tasks.failed[index]
            masked_n = tasks.masked[index]
            if not n and not failed and not masked_n:
                continue  # not finished yet (an aborted run)
            row = {
                "task_index": index,
                "scored": n,
                "passed": passed,
                "failed": failed,
                "masked": masked_n,
                "pass_rate": passed / n if n else None,
                "reward_mean": tasks.reward_sum[index] / n if n else None,
            }
            fh.write(orjson.dumps(row) + b"\n")
    return m
