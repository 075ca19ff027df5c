"""Rollouts tagged by their integrity verdict, per policy step: the onset of reward hacking.

Each line of ``rollouts.jsonl`` carries the verdict the collector gave it
(``rollgym.audit.scan``: ``clean``, ``suspect`` or ``exploit``). Production RL reports the
onset of hacking when more than 2% of a step's rollouts are tagged (arXiv 2511.18397), so the
check judges the tagged share of the whole run and of each **step** (the policy version of the
rollout's last model call, ``rollgym.server.versions``; a run whose model server does not say
is one step) with ``MIN_STEP_ROLLOUTS`` rollouts or more, and reports the worst. Lines without
a verdict (written before verdicts existed) are not counted: a run with none is unobserved.

Memory: two counters per step, and the check's first examples.
"""

from __future__ import annotations

from typing import Any

from rollgym.collect.layout import LedgerLine
from rollgym.collect.metrics import IntegrityCounts
from rollgym.health.checks import EXAMPLES, Example
from rollgym.server.versions import rollout_versions

MIN_STEP_ROLLOUTS = 50
"""Rollouts a step needs to be judged on its own (one tagged of 10 is no onset)."""
STEPS_KEPT = 500
"""Steps listed in ``detail.steps`` (the first ones)."""


class TaggedSteps:
    """The run's verdicts (``IntegrityCounts``) and, per step, [tagged, rollouts]."""

    def __init__(self) -> None:
        self.run = IntegrityCounts()
        self.steps: dict[int | None, list[int]] = {}
        self.examples: list[Example] = []

    def rollout(self, line: LedgerLine) -> None:
        """Count one record of rollouts.jsonl."""
        rec = line.record
        verdict = self.run.add(rec)
        if verdict is None:
            return
        versions = [v for v in rollout_versions(rec.get("response")) if v is not None]
        counts = self.steps.setdefault(versions[-1] if versions else None, [0, 0])
        counts[1] += 1
        if verdict == "clean":
            return
        counts[0] += 1
        if len(self.examples) < EXAMPLES:
            reasons = rec["integrity"].get("reasons")
            shown = ", ".join(r for r in reasons[:3] if isinstance(r, str)) if reasons else ""
            self.examples.append(
                Example(line.path.name, line.lineno, *line.key, f"{verdict}: {shown}"[:200])
            )

    def judged(self) -> tuple[int, int, list[Example], dict[str, Any]]:
        """(tagged, rollouts, first examples, detail) of the worst of the whole run and each
        step with ``MIN_STEP_ROLLOUTS`` rollouts or more."""
        worst_step: int | None = None
        tagged, of = self.run.tagged, self.run.rollouts
        for step, (n_tagged, n) in self.steps.items():
            if n >= MIN_STEP_ROLLOUTS and n_tagged * of > tagged * n:
                worst_step, tagged, of = step, n_tagged, n
        shown = list(self.steps.items())[:STEPS_KEPT]
        detail: dict[str, Any] = {
            **self.run.to_dict(),
            "worst_step": worst_step,
            "min_step_rollouts": MIN_STEP_ROLLOUTS,
            "steps": [[step, n_tagged, n] for step, (n_tagged, n) in shown],
            "steps_columns": ["policy_version", "tagged", "rollouts"],
        }
        return tagged, of, self.examples, detail
