"""The health checks: what each one counts, its threshold, and its verdict.

Each check counts something over the run (``count``), usually out of something (``of``); its
``value`` is the count (``measure="count"``) or the share ``count / of`` (``"rate"``), and it
**fails when the value exceeds its threshold**. A check with nothing to judge (``of`` is 0:
no token data in the run, no metrics.json) is ``unobserved``, never a pass in disguise.

The checks NeMo Gym 0.7's ``gym eval health-check`` makes, read from rollgym's records (it reads
its ``ng_trajectory`` captures, which rollgym does not write): duplicate identities, missing agent
turns, hollow turns, zero completion tokens, missing token counts, runaway generations, token-count
mismatches, tasks that never succeed (every repeat a failure) and tasks consistently unhealthy
(every repeat a failure or a rollout with one of those findings). Its ``model_call_failed`` and
``rollout_ended_on_failed_model_call`` have no counterpart: a rollgym rollout whose model call
failed for good is a failure record, never scored, and counted by ``failure_rate`` and
``failure_bursts``. Then rollgym's own: the ledger invariant, failures by server over time,
re-tokenisation drift, retries and attempts, masked samples, rollouts tagged by their integrity
verdict (``rollgym.health.integrity``), and groups whose rewards are all equal (no gradient for
GRPO: ``rollgym.health.groups``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rollgym.errors import ConfigError

Measure = Literal["count", "rate"]
Outcome = Literal["pass", "fail", "unobserved", "skipped"]


@dataclass(frozen=True, slots=True)
class CheckSpec:
    id: str
    measure: Measure
    threshold: float
    """The default: the check fails when its value is above it."""
    counts: str
    """What is counted, out of what (the table's last column)."""


SPECS: tuple[CheckSpec, ...] = (
    # The ledger invariant (DESIGN.md): one record per row of tasks.jsonl.
    CheckSpec("duplicate_records", "count", 0,
              "extra records of a (task, rollout) in rollouts.jsonl + failures.jsonl"),
    CheckSpec("unknown_records", "count", 0, "records of no row of tasks.jsonl"),
    CheckSpec("missing_records", "count", 0,
              "rows of tasks.jsonl without a record (judged once the run completed)"),
    CheckSpec("duplicate_task_rows", "count", 0, "rows of tasks.jsonl with the same indices"),
    # ``gym eval health-check``'s kinds, per recorded rollout.
    CheckSpec("missing_agent_turns", "rate", 0.01,
              "rollouts without a model item in response.output / rollouts"),
    CheckSpec("hollow_turns", "rate", 0.01,
              "rollouts with a model turn of no text and no tool call / rollouts"),
    CheckSpec("zero_completion_tokens", "rate", 0.01,
              "rollouts with a model call that generated 0 tokens / rollouts with counts"),
    CheckSpec("runaway_generations", "rate", 0.05,
              "rollouts with a call stopped at max_output_tokens / rollouts"),
    CheckSpec("token_count_mismatch", "count", 0,
              "rollouts whose token ids disagree with usage or their logprobs"),
    CheckSpec("missing_token_counts", "rate", 0.01,
              "rollouts with model turns but no usage and no token ids / rollouts"),
    CheckSpec("tasks_always_failing", "count", 0,
              "tasks with 2+ records, every one a failure"),
    CheckSpec("tasks_always_unhealthy", "count", 0,
              "tasks with 2+ records, each a failure or with a finding above (not all failures)"),
    # rollgym's own.
    CheckSpec("failure_rate", "rate", 0.05, "failures / records"),
    CheckSpec("failure_bursts", "rate", 0.5,
              "worst server's failures / records finished in one time window (20+ records)"),
    CheckSpec("token_drift", "rate", 0.0,
              "rollouts with drifted_turns > 0 / rollouts checked for drift"),
    CheckSpec("model_call_retries", "rate", 0.1, "model-call retries / model calls"),
    CheckSpec("rollout_attempts", "rate", 0.1, "records with attempts > 1 / records"),
    CheckSpec("server_retries", "rate", 0.1,
              "worst caller->server retries / calls in metrics.json (20+ calls)"),
    CheckSpec("masked_samples", "rate", 0.05, "rollouts with mask_sample: true / rollouts"),
    # The onset of reward hacking (arXiv 2511.18397): rollgym.health.integrity.
    CheckSpec("integrity_tagged", "rate", 0.02,
              "rollouts whose integrity verdict is suspect or exploit / rollouts with one (run "
              "or worst policy step of 50+)"),
    # GRPO's view: a group of equal rewards has every advantage 0 (rollgym.health.groups).
    CheckSpec("no_signal_groups", "rate", 0.5,
              "tasks whose 2+ scored rollouts all got one reward / tasks with 2+ (run or worst "
              "environment)"),
)  # fmt: skip

SPEC_BY_ID = {spec.id: spec for spec in SPECS}

EXAMPLES = 10
"""Examples kept per check (with their file and line): enough to start looking."""


@dataclass(frozen=True, slots=True)
class Example:
    """One offending record (or row), where it is and what is wrong."""

    file: str | None
    line: int | None
    task_index: int | None
    rollout_index: int | None
    note: str

    def where(self) -> str:
        if self.file is None and self.task_index is not None and self.rollout_index is None:
            return f"task {self.task_index}: {self.note}"  # a finding about a whole task
        place = f"{self.file}:{self.line}" if self.file else "-"
        if self.task_index is None:
            key = ""
        elif self.rollout_index is None:
            key = f" (task {self.task_index})"
        else:
            key = f" (task {self.task_index}, rollout {self.rollout_index})"
        return f"{place}{key}: {self.note}"


@dataclass(frozen=True, slots=True)
class CheckResult:
    id: str
    outcome: Outcome
    measure: Measure
    threshold: float
    count: int
    of: int | None
    value: float | None
    counts: str
    examples: tuple[Example, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "outcome": self.outcome,
            "value": self.value,
            "threshold": self.threshold,
            "measure": self.measure,
            "count": self.count,
            "of": self.of,
            "counts": self.counts,
            "examples": [
                {"file": e.file, "line": e.line, "task_index": e.task_index,
                 "rollout_index": e.rollout_index, "note": e.note}
                for e in self.examples
            ],
            "detail": self.detail,
        }  # fmt: skip


def judge(
    spec: CheckSpec,
    threshold: float,
    count: int,
    of: int | None,
    examples: list[Example] | tuple[Example, ...] = (),
    detail: dict[str, Any] | None = None,
    *,
    observed: bool = True,
) -> CheckResult:
    """The verdict of ``spec`` on ``count`` out of ``of`` (``of`` None: a count check with no
    denominator); unobserved when there was nothing to judge."""
    value: float | None
    outcome: Outcome
    if not observed or of == 0:
        value, outcome = None, "unobserved"
    else:
        value = float(count) if spec.measure == "count" or of is None else count / of
        outcome = "fail" if value > threshold else "pass"
    return CheckResult(
        spec.id, outcome, spec.measure, threshold, count, of, value, spec.counts,
        tuple(examples[:EXAMPLES]), detail or {},
    )  # fmt: skip


def skipped(spec: CheckSpec, threshold: float) -> CheckResult:
    return CheckResult(spec.id, "skipped", spec.measure, threshold, 0, None, None, spec.counts)


def thresholds(overrides: list[str] | None) -> dict[str, float]:
    """Every check's threshold, ``CHECK=VALUE`` overrides applied (a ``ConfigError`` naming
    the bad one: an unknown check, a value that is no number, a rate outside 0..1)."""
    out = {spec.id: float(spec.threshold) for spec in SPECS}
    for given in overrides or []:
        name, sep, raw = given.partition("=")
        name = name.strip()
        spec = SPEC_BY_ID.get(name)
        if not sep or spec is None:
            raise ConfigError(
                f"--max {given!r}: expected CHECK=VALUE with CHECK one of {', '.join(SPEC_BY_ID)}"
            )
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"--max {given!r}: {raw!r} is not a number") from None
        if not value >= 0 or value == float("inf") or (spec.measure == "rate" and value > 1):
            kind = "a rate from 0 to 1" if spec.measure == "rate" else "a count >= 0"
            raise ConfigError(f"--max {given!r}: {name} takes {kind}")
        out[name] = value
    return out


def known(names: list[str] | None, option: str) -> frozenset[str]:
    """``names`` if each is a check's id (a ``ConfigError`` naming ``option`` if not)."""
    unknown = sorted(set(names or ()) - set(SPEC_BY_ID))
    if unknown:
        raise ConfigError(
            f"{option} {', '.join(unknown)}: no such check (checks: {', '.join(SPEC_BY_ID)})"
        )
    return frozenset(names or ())
