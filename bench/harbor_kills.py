"""SIGKILL the collector of a Harbor run N times at seeded random points (while its containers
live) and count what each next run leaves of the killed one (issue 40 item 6: 0 within 5 s).

    PYTHONPATH=$PWD/src python bench/harbor_kills.py [N] [SEED]

Prints "N kills, containers left after next start: X (max seconds to clean)"; seconds are from
the next run's start to the last of the killed run's containers and images gone, beside the
5 s target.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harbor.kills import CLEAN_WAIT, kill_cycles

TARGET = 5.0


def main() -> None:
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    with tempfile.TemporaryDirectory(prefix="rollgym-kills-") as tmp:
        report = kill_cycles(Path(tmp), kills, seed=seed)
    for i, c in enumerate(report.cycles):
        clean = f"{c.clean_seconds:.2f} s" if c.clean_seconds is not None else f">{CLEAN_WAIT:g} s"
        gone = f"{c.owners_gone:.2f} s" if c.owners_gone is not None else "not seen"
        print(f"kill {i + 1}: {c.killed_after:.2f} s after a container, its processes gone in "
              f"{gone}, clean in {clean}, left {c.left_after_clean}, "
              f"past deadline {c.past_deadline}")  # fmt: skip
    worst = report.max_clean
    worst_s = f"{worst:.2f} s" if worst is not None else f"more than {CLEAN_WAIT:g} s"
    print(f"{len(report.cycles)} kills, containers left after next start: {report.left} "
          f"(max seconds to clean: {worst_s}; target {TARGET:g} s, "
          f"{'met' if worst is not None and worst <= TARGET else 'missed'})")  # fmt: skip


if __name__ == "__main__":
    main()
