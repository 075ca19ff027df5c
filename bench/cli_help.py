"""How long ``rollgym --help`` takes, as CPU time and as wall time.

    .venv/bin/python bench/cli_help.py [--runs 15]

Runs ``rollgym --help`` (and, as the floor, ``python -c pass``) ``--runs`` times and prints the
median and the range of each. CPU time (user + system, from ``getrusage`` of the children) is
what the command costs and barely moves with the machine's load; wall time is what a person
waits, and on a busy machine includes the wait for a free core, so both are printed, with the
load average they were measured under.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROLLGYM = str(Path(sys.executable).parent / "rollgym")


def timed(cmd: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(CPU seconds, wall seconds) of each of ``runs`` runs of ``cmd``."""
    cpu, wall = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        subprocess.run(cmd, capture_output=True, check=True, timeout=60)
        wall.append(time.monotonic() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return cpu, wall


def show(label: str, values: list[float]) -> str:
    return f"{label} {statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.1f}; median (range) of {args.runs} runs")
    for name, cmd in (("python -c pass", [sys.executable, "-c", "pass"]),
                      ("rollgym --help", [ROLLGYM, "--help"])):  # fmt: skip
        cpu, wall = timed(cmd, args.runs)
        print(f"  {name:<15} {show('CPU', cpu)}; {show('wall', wall)}")


if __name__ == "__main__":
    main()
