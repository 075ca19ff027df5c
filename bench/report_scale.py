"""Time and peak memory of ``rollgym health`` and ``rollgym report`` at two sizes of one run.

    .venv/bin/python bench/report_scale.py [--lines 100000] [--scale 10] [--fail 0.05]
    .venv/bin/python bench/report_scale.py --fail 1        # failures only (issue 36's probe)
    .venv/bin/python bench/report_scale.py --src /tmp/old/src   # another checkout's code

Writes two synthetic run directories (in a temporary folder) of ``--lines`` and ``--lines`` x
``--scale`` ledger lines (a share ``--fail`` of them in ``failures.jsonl``, 4 repeats a task),
then runs ``check_run`` and ``write_report`` on each in a fresh process and prints its wall time
and its own peak RSS (``VmHWM``: ``ru_maxrss`` of a child carries its parent's over ``exec``,
see ``bench/peak.py``), and the ratios between the sizes. Memory that does not grow with the
run keeps the RSS ratio near 1 while the time ratio follows the lines. Figures, not
assertions: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 4

_CHILD = """
import sys, time
from pathlib import Path
t = time.monotonic()
if sys.argv[1] == "health":
    from rollgym.health import check_run
    check_run(Path(sys.argv[2]))
else:
    from rollgym.report import write_report
    write_report(Path(sys.argv[2]))
wall = time.monotonic() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(wall, hwm)
"""


def make_run(out: Path, lines: int, fail: float, seed: int = 0) -> None:
    """A run directory of ``lines`` ledger lines shaped like a real one."""
    rng = random.Random(seed)
    out.mkdir(parents=True)
    t0 = 1.79e9
    with (
        (out / "tasks.jsonl").open("wb") as tf,
        (out / "rollouts.jsonl").open("wb") as rf,
        (out / "failures.jsonl").open("wb") as ff,
    ):
        for i in range(lines):
            task, rep = divmod(i, REPEATS)
            key = {"task_index": task, "rollout_index": rep}
            tf.write(orjson.dumps({"responses_create_params": {"input": f"q {task}"}, **key}))
            tf.write(b"\n")
            at = t0 + i * 0.01
            if rng.random() < fail:
                error = {"type": "http_status", "status": 500, "message": "nan logprob",
                         "server": "model", "retryable": True}  # fmt: skip
                ff.write(orjson.dumps({**key, "attempts": 1, "finished_at": at, "error": error}))
                ff.write(b"\n")
                continue
            output = [
                {"type": "function_call", "name": "lookup", "arguments": "{}", "call_id": "c"},
                {"type": "function_call_output", "call_id": "c", "output": "{}"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "4", "annotations": []}]},
            ]  # fmt: skip
            rec = {
                **key,
                "reward": float(rng.random() < 0.6),
                "response": {"status": "completed", "output": output,
                             "usage": {"input_tokens": 40, "output_tokens": 9}},
                "rollgym_timing": {"seed": [0.001], "model": [0.02, 0.03], "tool": [0.002],
                                   "verify": [0.001], "retries": {}, "wait_s": 0.0},
                "attempts": 1,
                "duration_s": 0.05 + rng.random() / 10,
                "finished_at": at,
            }  # fmt: skip
            rf.write(orjson.dumps(rec) + b"\n")
    run = {"status": "completed", "total": lines, "inputs": {"repeats": REPEATS}}
    (out / "run.json").write_bytes(orjson.dumps(run))


def measure(what: str, run: Path, src: Path) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of ``what`` on ``run`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, what, str(run)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    wall, hwm = done.stdout.split()
    return float(wall), int(hwm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--fail", type=float, default=0.05)
    parser.add_argument("--src", type=Path, default=ROOT / "src")
    args = parser.parse_args()
    sizes = (args.lines, args.lines * args.scale)
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for n in sizes:
            started = time.monotonic()
            make_run(Path(tmp) / str(n), n, args.fail)
            runs.append(Path(tmp) / str(n))
            print(f"made a run of {n:,} lines in {time.monotonic() - started:.1f}s")
        for what in ("health", "report"):
            got = [measure(what, run, args.src) for run in runs]
            for n, (wall, hwm) in zip(sizes, got, strict=True):
                print(f"{what:7s} {n:>10,} lines: {wall:7.2f}s  peak RSS {hwm / 1024:7.1f} MiB")
            (w0, m0), (w1, m1) = got
            print(f"{what:7s} x{args.scale} lines: time x{w1 / w0:.1f}, peak RSS x{m1 / m0:.2f} "
                  f"(+{(m1 - m0) / 1024:.1f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
