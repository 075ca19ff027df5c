"""``check_run``: the health of a run directory, its verdicts, ``health.json`` and a table.

    tasks.jsonl (twice) ─► Slots        the rows the run asked for, a byte each
    rollouts.jsonl ──────► Tally        one streaming pass: ledger, turns, tokens, masks
                     ├──► RewardGroups  ... and each task's rewards: all equal or not
                     └──► TaggedSteps   ... and integrity verdicts per policy step
    failures.jsonl ──────► Tally        ... servers, windows, attempts
    metrics.json, run.json              per-server retries; whether the run completed
    Tally ─► judge ─► HealthReport      one CheckResult per check; health.json; the table

The files are streamed by the one ledger reader (``collect.layout.read_ledger``) in its
``TORN_LAST`` mode: a torn last line is a warning, any other bad line an ``InputError`` naming
the file and line.

The same directory always gives the same ``health.json`` (no clock is read).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.layout import METRICS, RUN_JSON, RunDir, Tolerance, read_ledger
from rollgym.collect.rundir import read_state
from rollgym.errors import ConfigError, InputError
from rollgym.health.checks import (
    SPEC_BY_ID,
    SPECS,
    CheckResult,
    Example,
    judge,
    skipped,
)
from rollgym.health.environments import Environments
from rollgym.health.groups import RewardGroups
from rollgym.health.integrity import TaggedSteps
from rollgym.health.slots import Slots
from rollgym.health.tally import Counted, Tally

HEALTH_FILE = "health.json"
WINDOW_S = 60.0
"""Default width of the time windows ``failure_bursts`` compares, in seconds."""
MIN_WINDOW_RECORDS = 20
"""A window with fewer records is too small to call a burst (two failures of three)."""
MIN_SERVER_CALLS = 20
TIMELINE_LIMIT = 500
"""Windows per server kept in health.json's failure timeline (the first ones)."""
COMPLETED = frozenset({"completed", "completed_with_failures"})


@dataclass(frozen=True)
class HealthReport:
    root: Path
    status: str | None
    """``run.json``'s status (``died`` for a dead run), None without a readable run.json."""
    rows: int
    rollouts: int
    failures: int
    warnings: tuple[str, ...]
    checks: tuple[CheckResult, ...]

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.checks if c.outcome == "fail")

    @property
    def exit_code(self) -> int:
        """0 every judged check passed; 1 one failed its threshold."""
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": str(self.root),
            "status": self.status,
            "passed": not self.failed,
            "exit_code": self.exit_code,
            "failed": list(self.failed),
            "counts": {"rows": self.rows, "rollouts": self.rollouts, "failures": self.failures},
            "warnings": list(self.warnings),
            "checks": [c.to_dict() for c in self.checks],
        }


def check_run(
    root: Path,
    thresholds: dict[str, float] | None = None,
    skip: Iterable[str] = (),
    window_s: float = WINDOW_S,
) -> HealthReport:
    """Check the run in ``root``. ``ConfigError`` if it is no run directory, ``InputError``
    naming the file and line if one of its files cannot be read (a torn last line is only a
    warning)."""
    if not root.is_dir():
        raise ConfigError(f"{root}: no such run directory")
    files = RunDir(root)
    if not files.tasks.is_file():
        raise InputError(f"{files.tasks}: missing (not a run directory, or one never started)")
    if not window_s > 0 or window_s == float("inf"):
        raise ConfigError(f"--window {window_s}: use a number of seconds > 0")
    limits = {spec.id: float(spec.threshold) for spec in SPECS} | (thresholds or {})
    warnings: list[str] = []
    tally = Tally(Slots.shaped(read_ledger(files.tasks, Tolerance.TORN_LAST, [])), window_s)
    groups = RewardGroups(tally.slots, window_s, Environments(files.read_json(RUN_JSON)))
    tagged = TaggedSteps()
    duplicate_rows, rows = Counted(), 0
    for line in read_ledger(files.tasks, Tolerance.TORN_LAST, warnings):
        rows += 1
        if not tally.slots.expect(line.key):
            duplicate_rows.add(line, "a second row with these indices")
    for line in read_ledger(files.rollouts, Tolerance.TORN_LAST, warnings):
        tally.rollout(line)
        groups.rollout(line)
        tagged.rollout(line)
    for line in read_ledger(files.failures, Tolerance.TORN_LAST, warnings):
        tally.failure(line)
    state = read_state(root)
    status = state.status if state else None
    if status is not None and status not in COMPLETED:
        warnings.append(f"run.json says the run is {status}: missing records are not judged")
    metrics = files.read_json(METRICS)
    results = _judged(
        tally, rows, duplicate_rows, status, metrics, limits, frozenset(skip), groups, tagged
    )
    return HealthReport(
        root, status, rows, tally.rollouts, tally.failures, tuple(warnings), tuple(results)
    )


def _judged(
    t: Tally,
    rows: int,
    duplicate_rows: Counted,
    status: str | None,
    metrics: dict[str, Any],
    limits: dict[str, float],
    skip: frozenset[str],
    groups: RewardGroups,
    tagged: TaggedSteps,
) -> list[CheckResult]:
    records = t.rollouts + t.failures
    missing = Counted()
    for key in t.slots.missing():
        missing.add(None, "no record in rollouts.jsonl or failures.jsonl", key)
    always, unhealthy = Counted(), Counted()
    for task, got, failed, sick in t.slots.task_totals():
        if got < 2:
            continue  # one repeat says nothing about the task (2 repeats at least)
        always.of += 1
        unhealthy.of += 1
        if failed == got:
            always.add(None, f"all {got} records are failures", (task, None))
        elif sick == got:
            unhealthy.add(None, f"all {got} records failed or have a finding", (task, None))
    burst_count, burst_of, burst_detail = _bursts(t)
    retries, calls, retry_detail = _server_retries(metrics)
    found: dict[str, tuple[int, int | None, list[Example], dict[str, Any], bool]] = {
        "duplicate_records": (t.duplicates.count, records, t.duplicates.examples, {}, True),
        "unknown_records": (t.unknown.count, records, t.unknown.examples, {}, True),
        "missing_records": (
            missing.count, rows, missing.examples,
            {"status": status, "pending": missing.count}, status is None or status in COMPLETED,
        ),
        "duplicate_task_rows": (duplicate_rows.count, rows, duplicate_rows.examples, {}, True),
        "missing_agent_turns": (t.missing_turns.count, t.rollouts, t.missing_turns.examples, {},
                                True),
        "hollow_turns": (t.hollow.count, t.rollouts, t.hollow.examples, {}, True),
        "zero_completion_tokens": (t.zero_completion.count, t.zero_completion.of,
                                   t.zero_completion.examples, {}, True),
        "runaway_generations": (t.runaway.count, t.rollouts, t.runaway.examples, {}, True),
        "token_count_mismatch": (t.mismatch.count, t.mismatch.of, t.mismatch.examples, {}, True),
        "tasks_always_failing": (always.count, always.of, always.examples, {}, True),
        "tasks_always_unhealthy": (unhealthy.count, unhealthy.of, unhealthy.examples, {}, True),
        "missing_token_counts": (t.no_counts.count, t.rollouts, t.no_counts.examples, {}, True),
        "failure_rate": (t.failures, records, [],
                         {"by_server": dict(t.by_server.most_common()),
                          "by_type": dict(t.by_type.most_common()),
                          "by_root": t.causes.totals(),
                          "by_root_context": t.causes.contexts()}, True),
        "failure_bursts": (burst_count, burst_of, [], burst_detail, True),
        "token_drift": (t.drift.count, t.drift.of, t.drift.examples, {}, True),
        "model_call_retries": (t.model_retries, t.model_calls, [], {}, True),
        "rollout_attempts": (t.attempts.count, records, t.attempts.examples, {}, True),
        "server_retries": (retries, calls, [], retry_detail, True),
        "masked_samples": (t.masked.count, t.rollouts, t.masked.examples, {}, True),
        "integrity_tagged": (*tagged.judged(), True),
        "no_signal_groups": (*groups.judged(), True),
    }  # fmt: skip
    out = []
    for spec in SPECS:
        if spec.id in skip:
            out.append(skipped(spec, limits[spec.id]))
            continue
        count, of, examples, detail, observed = found[spec.id]
        out.append(judge(spec, limits[spec.id], count, of, examples, detail, observed=observed))
    assert set(found) == set(SPEC_BY_ID)
    return out


def _bursts(t: Tally) -> tuple[int, int, dict[str, Any]]:
    """The worst (server, window) by failure share among windows of enough records."""
    worst: tuple[float, int, int, str, int] | None = None
    timeline: dict[str, list[list[float | int]]] = {}
    for (server, window), failed in sorted(t.window_failures.items()):
        records = t.window_records[window]
        entries = timeline.setdefault(server, [])
        if len(entries) < TIMELINE_LIMIT:
            entries.append([window * t.window_s, failed, records])
        if records >= MIN_WINDOW_RECORDS:
            candidate = (failed / records, failed, records, server, window)
            if worst is None or candidate[:3] > worst[:3]:
                worst = candidate
    detail: dict[str, Any] = {
        "window_s": t.window_s,
        "min_records": MIN_WINDOW_RECORDS,
        "windows": len(t.window_records),
        "timeline": timeline,
        "timeline_columns": ["window_start", "failures", "records"],
    }
    if worst is None:
        # No failures in a window big enough: judged (0 of the largest window) when there
        # is a window big enough at all.
        biggest = max(t.window_records.values(), default=0)
        return 0, biggest if biggest >= MIN_WINDOW_RECORDS else 0, detail
    _, failed, records, server, window = worst
    detail["worst"] = {"server": server, "window_start": window * t.window_s}
    return failed, records, detail


def _server_retries(metrics: dict[str, Any]) -> tuple[int, int, dict[str, Any]]:
    """The worst caller->server retries per call of ``metrics.json`` (``servers`` and the
    collector's own ``http``), among pairs with enough calls."""
    pairs: list[tuple[str, dict[str, Any]]] = []
    servers = metrics.get("servers")
    for caller, called in servers.items() if isinstance(servers, dict) else ():
        for server, stats in called.items() if isinstance(called, dict) else ():
            pairs.append((f"{caller}->{server}", stats))
    http = metrics.get("http")
    for server, stats in http.items() if isinstance(http, dict) else ():
        pairs.append((f"collector->{server}", stats))
    worst: tuple[float, int, int, str] | None = None
    for name, stats in pairs:
        calls, retries = _int(stats, "calls"), _int(stats, "retries")
        if calls >= MIN_SERVER_CALLS:
            candidate = (retries / calls, retries, calls, name)
            if worst is None or candidate[:3] > worst[:3]:
                worst = candidate
    if worst is None:
        return 0, 0, {"min_calls": MIN_SERVER_CALLS}
    return worst[1], worst[2], {"min_calls": MIN_SERVER_CALLS, "worst": worst[3]}


def _int(stats: Any, key: str) -> int:
    value = stats.get(key) if isinstance(stats, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0


def write_health(report: HealthReport) -> Path:
    """Write ``health.json`` in the run directory (atomically; never through a link)."""
    path = report.root / HEALTH_FILE
    if path.is_symlink():
        raise ConfigError(f"{path} is a symbolic link: rollgym never writes through one")
    tmp = path.with_name(f".{HEALTH_FILE}.{os.getpid()}.tmp")
    data = orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2) + b"\n"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot be written: {exc.strerror or exc}") from None
    return path
