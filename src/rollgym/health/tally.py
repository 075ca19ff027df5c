"""One streaming pass over a run's ledger, counted into what the checks judge.

Memory is bounded by the run's shape, not its records: a byte per rollout slot and two
counters per task (``Slots``), a counter per time window (and per failing server in it), and
at most ``EXAMPLES`` examples per check. No record is kept after its line is counted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rollgym.collect.layout import LedgerLine
from rollgym.collect.metrics import CauseCounts
from rollgym.errors import root_cause, root_record
from rollgym.health.checks import EXAMPLES, Example
from rollgym.health.slots import Slots
from rollgym.health.turns import RolloutFacts, rollout_facts
from rollgym.protocol import is_masked


@dataclass
class Counted:
    """A count and its first examples."""

    count: int = 0
    of: int = 0
    examples: list[Example] = field(default_factory=list)

    def add(
        self, line: LedgerLine | None, note: str, key: tuple[int, int | None] | None = None
    ) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            if key is None and line is not None:
                key = line.key
            self.examples.append(
                Example(
                    line.path.name if line else None,
                    line.lineno if line else None,
                    key[0] if key else None,
                    key[1] if key else None,
                    note,
                )
            )


@dataclass
class Tally:
    """Everything the checks need, counted line by line."""

    slots: Slots
    window_s: float
    rollouts: int = 0
    failures: int = 0
    duplicates: Counted = field(default_factory=Counted)
    unknown: Counted = field(default_factory=Counted)
    missing_turns: Counted = field(default_factory=Counted)
    hollow: Counted = field(default_factory=Counted)
    zero_completion: Counted = field(default_factory=Counted)
    runaway: Counted = field(default_factory=Counted)
    mismatch: Counted = field(default_factory=Counted)
    no_counts: Counted = field(default_factory=Counted)
    drift: Counted = field(default_factory=Counted)
    masked: Counted = field(default_factory=Counted)
    attempts: Counted = field(default_factory=Counted)
    model_calls: int = 0
    model_retries: int = 0
    by_server: Counter[str] = field(default_factory=Counter)
    by_type: Counter[str] = field(default_factory=Counter)
    causes: CauseCounts = field(default_factory=CauseCounts)
    """By root cause, with context (``rollgym.errors.root_cause``)."""
    window_records: Counter[int] = field(default_factory=Counter)
    window_failures: Counter[tuple[str, int]] = field(default_factory=Counter)

    def ledger(self, line: LedgerLine, failed: bool, unhealthy: bool) -> bool:
        """Count ``line`` in the ledger (``unhealthy``: a rollout with a finding of its own);
        False if it names no row of tasks.jsonl."""
        key = line.key
        if not self.slots.expected(key):
            self.unknown.add(line, "no row of tasks.jsonl has these indices")
            return False
        if self.slots.record(key) > 1:
            self.duplicates.add(line, "a second record of this rollout")
        self.slots.count_task(key[0], failed, unhealthy)
        attempts = line.record.get("attempts")
        if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 1:
            self.attempts.add(line, f"attempts {attempts}")
        return True

    def when(self, record: dict[str, Any]) -> int | None:
        """The time window the record finished in (None: no usable ``finished_at``)."""
        at = record.get("finished_at")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            return None
        window = int(at // self.window_s)
        self.window_records[window] += 1
        return window

    def rollout(self, line: LedgerLine) -> None:
        """Count one record of rollouts.jsonl."""
        self.rollouts += 1
        self.when(line.record)
        rec = line.record
        facts = rollout_facts(rec)
        found = self._findings(line, facts)
        self.ledger(line, failed=False, unhealthy=found)
        if facts.drifted_turns is not None:
            self.drift.of += 1
            if facts.drifted_turns:
                self.drift.add(line, f"drifted_turns {facts.drifted_turns}")
        if facts.model_calls is not None:
            self.model_calls += facts.model_calls
            self.model_retries += facts.model_retries
        if is_masked(rec):
            self.masked.add(line, "mask_sample: true")

    def _findings(self, line: LedgerLine, facts: RolloutFacts) -> bool:
        """Count the per-rollout findings (``checks.py``'s) on one rollout; whether there was one."""
        before = sum(c.count for c in self._rollout_checks())
        hollow = [i for i, t in enumerate(facts.turns) if t.hollow]
        if not facts.turns:
            self.missing_turns.add(line, "response.output has no model item")
        elif hollow:
            self.hollow.add(
                line, f"turn {hollow[0] + 1} of {len(facts.turns)} has no text and no tool call"
            )
        zero = facts.zero_completion()
        if zero is not None:
            self.zero_completion.of += 1
            if zero:
                self.zero_completion.add(line, "a model call generated 0 tokens")
        if facts.length_stopped:
            self.runaway.add(line, "a model call stopped at the token limit")
        if facts.token_calls:
            self.mismatch.of += 1
            why = facts.token_mismatch()
            if why:
                self.mismatch.add(line, why)
        if facts.turns and zero is None:
            self.no_counts.add(line, "no usage and no token ids")
        return sum(c.count for c in self._rollout_checks()) > before

    def _rollout_checks(self) -> tuple[Counted, ...]:
        return (self.missing_turns, self.hollow, self.zero_completion, self.runaway,
                self.mismatch, self.no_counts)  # fmt: skip

    def failure(self, line: LedgerLine) -> None:
        """Count one record of failures.jsonl, under the server where it started."""
        self.failures += 1
        self.ledger(line, failed=True, unhealthy=True)
        window = self.when(line.record)
        error = line.record.get("error")
        root = root_record(error) if isinstance(error, dict) else {}
        server = root.get("server")
        server = server if isinstance(server, str) and server else "unknown"
        kind = root.get("type")
        self.by_server[server] += 1
        self.by_type[kind if isinstance(kind, str) else "unknown"] += 1
        cause = root_cause(error) if isinstance(error, dict) else None
        if cause is not None:
            self.causes.add(cause.type, cause.context)
        else:
            self.causes.add("unknown", None)
        if window is not None:
            self.window_failures[(server, window)] += 1
