"""Gate a training step on the health of the rollouts it would train on."""

import sys
from pathlib import Path

from rollgym.health import check_run, thresholds, write_health

run = Path(sys.argv[1])
limits = thresholds(["hollow_turns=0.02", "failure_rate=0.1"])  # as --max CHECK=VALUE
report = check_run(run, limits, skip={"server_retries"})
write_health(report)  # run/health.json, as `rollgym health` writes it
for check in report.checks:
    if check.outcome == "fail":
        print(f"{check.id}: {check.value:.3g} > {check.threshold:g} ({check.counts})")
        for example in check.examples[:3]:
            print("   ", example.where())
sys.exit(report.exit_code)  # 0: train on it; 1: look first
