"""``rollgym health``: deterministic checks over a run directory, each with a threshold.

slots.py     the rows of tasks.jsonl as a byte per rollout (the ledger invariant)
turns.py     one rollout's model turns, token data and usage, read defensively
tally.py     one streaming pass over the ledger, counted
groups.py    each task's rewards: groups whose rewards are all equal (no signal for GRPO)
integrity.py rollouts tagged by their integrity verdict, per policy step
environments.py  a record's environment, read from the record and run.json
checks.py    the checks, their default thresholds and the verdict
run.py       check_run -> HealthReport; write_health -> DIR/health.json
show.py      the terminal table and the report page's section
"""

from __future__ import annotations

from pathlib import Path

from rollgym.errors import RollgymError
from rollgym.health.checks import SPECS, CheckResult, CheckSpec, thresholds
from rollgym.health.run import HEALTH_FILE, HealthReport, check_run, write_health


def report_section(root: Path, name: str) -> str:
    """The HTML section ``rollgym report`` shows for the run in ``root``: its health checks
    with the default thresholds (or why they could not be made). Writes nothing."""
    from rollgym.health.show import html_section, html_unreadable

    try:
        return html_section(check_run(root), name)
    except RollgymError as err:
        return html_unreadable(name, str(err))


__all__ = [
    "HEALTH_FILE",
    "SPECS",
    "CheckResult",
    "CheckSpec",
    "HealthReport",
    "check_run",
    "report_section",
    "thresholds",
    "write_health",
]
