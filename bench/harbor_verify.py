"""Seconds a Harbor trial's verify takes (end the agent phase, start the verifier, run test.sh,
read the reward), on one bundled task solved by its ``solve.sh``, N trials one after another.

    PYTHONPATH=$PWD/src python bench/harbor_verify.py [N] [TASK]

Prints the median, min and max. Run it with another checkout's ``src`` on ``PYTHONPATH`` to
compare two versions of ``rollgym.harbor.trial`` on the same machine.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

from rollgym.containers.lease import new_lease
from rollgym.containers.podman import PodmanRuntime
from rollgym.harbor.image import prepare
from rollgym.harbor.task import load_task
from rollgym.harbor.trial import Trial

TASKS = Path(__file__).resolve().parents[1] / "examples" / "harbor-tasks"


async def measure(n: int, name: str) -> list[float]:
    runtime = PodmanRuntime()
    task = load_task(TASKS / name)
    prepared = await prepare(task, runtime, new_lease("rollgym-bench-verify", 3600))
    seconds = []
    for _ in range(n):
        trial = Trial(prepared, runtime, new_lease("rollgym-bench-verify", 600))
        try:
            box = await trial.start()
            await box.exec(["bash", "-c", task.solution.read_text()], timeout=120)
            started = time.monotonic()
            verdict = await trial.verify()
            seconds.append(time.monotonic() - started)
        finally:
            await trial.close()
        if verdict.rewards.reward != 1.0:
            raise SystemExit(f"{name}: the oracle earned {verdict.rewards.reward}, not 1.0")
    return seconds


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    name = sys.argv[2] if len(sys.argv) > 2 else "hello-file"
    seconds = asyncio.run(measure(n, name))
    print(
        f"{name}: verify median {statistics.median(seconds):.3f} s, min {min(seconds):.3f}, "
        f"max {max(seconds):.3f} (n={n})"
    )


if __name__ == "__main__":
    main()
