"""Size and time of ``rollgym report`` on a large run, made up here (no servers needed).

    .venv/bin/python bench/report.py [--rollouts 100000] [--repeats 8] [--fail 0.03]

Writes a synthetic run directory (in a temporary folder) shaped like a real one: ``tasks.jsonl``,
``rollouts.jsonl`` whose records carry a Responses API response of a few hundred bytes and the
per-hop timing of a 2-turn tool rollout, ``failures.jsonl`` with typed errors, ``run.json`` and
``metrics.json``; then times ``write_report`` on it (alone, and compared with a second run) and
prints the file's size. Figures, not assertions: the machine is shared.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from rollgym.report import write_report

ERRORS = [
    ("http_status", "model", 500, "/v1/responses"),
    ("read_timeout", "lookup", None, "/lookup"),
    ("circuit_open", "model", None, "/v1/responses"),
    ("connection_lost", "agent", None, "/run"),
]


def make_run(out: Path, rollouts: int, repeats: int, fail: float, seed: int) -> None:
    rng = random.Random(seed)
    out.mkdir(parents=True)
    tasks = rollouts // repeats
    t0 = 1.79e9
    with (out / "tasks.jsonl").open("wb") as tf, (out / "rollouts.jsonl").open("wb") as rf, (
        out / "failures.jsonl"
    ).open("wb") as ff:  # fmt: skip
        for t in range(tasks):
            difficulty = rng.random()
            row = {
                "responses_create_params": {"input": f"question {t} " + "x" * 120},
                "expected_answer": str(t),
            }
            for r in range(repeats):
                stamped = {**row, "task_index": t, "rollout_index": r,
                           "_ng_task_index": t, "_ng_rollout_index": r}  # fmt: skip
                tf.write(orjson.dumps(stamped) + b"\n")
                end = t0 + (t * repeats + r) / 900.0 + rng.random()
                if rng.random() < fail:
                    kind, server, status, endpoint = rng.choice(ERRORS)
                    error = {"type": kind, "message": "injected", "status": status,
                             "server": server, "endpoint": endpoint, "attempts": 3,
                             "retryable": True, "origin": None}  # fmt: skip
                    rec = {"task_index": t, "rollout_index": r, "attempts": 1,
                           "duration_s": 0.2, "error": error, "finished_at": end}  # fmt: skip
                    ff.write(orjson.dumps(rec) + b"\n")
                    continue
                reward = 1.0 if rng.random() > difficulty else 0.0
                model = [rng.lognormvariate(-3.5, 0.6) for _ in range(2)]
                hops = {
                    "seed": [rng.lognormvariate(-6, 0.4)], "model": model,
                    "tool": [rng.lognormvariate(-5, 0.5)], "verify": [rng.lognormvariate(-5.5, 0.5)],
                    "retries": {"model": 1} if rng.random() < 0.02 else {},
                    "wait_s": 0.0, "total_s": sum(model) + 0.02, "end": end,
                }  # fmt: skip
                response = {
                    "id": f"resp_{t}_{r}", "object": "response", "status": "completed",
                    "output": [{"type": "message", "role": "assistant", "content": [
                        {"type": "output_text", "text": f"The answer is {t}. " + "y" * 200}]}],
                    "usage": {"input_tokens": 200, "output_tokens": 40, "total_tokens": 240},
                }  # fmt: skip
                rec = {**stamped, "response": response, "reward": reward, "attempts": 1,
                       "duration_s": hops["total_s"] + 0.003, "num_steps": 2,
                       "rollgym_timing": hops}  # fmt: skip
                rf.write(orjson.dumps(rec) + b"\n")
    info = {
        "status": "completed_with_failures", "total": tasks * repeats,
        "inputs": {"repeats": repeats}, "collect": {"repeats": repeats, "pass_threshold": 1.0},
    }  # fmt: skip
    (out / "run.json").write_bytes(orjson.dumps(info))
    metrics = {"http": {"agent": {"calls": rollouts, "retries": 12, "budget_refused": 0,
                                  "circuit_rejected": 3}},
               "dispatch": {"circuit_holds": 5, "failovers": 0}}  # fmt: skip
    (out / "metrics.json").write_bytes(orjson.dumps(metrics))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--fail", type=float, default=0.03)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base, other = Path(tmp) / "step-1000", Path(tmp) / "step-2000"
        t = time.monotonic()
        make_run(base, args.rollouts, args.repeats, args.fail, seed=1)
        make_run(other, args.rollouts, args.repeats, args.fail, seed=2)
        made_s = time.monotonic() - t
        ledger = (base / "rollouts.jsonl").stat().st_size / 1e6
        print(f"made 2 runs of {args.rollouts:,} rollouts in {made_s:.1f}s "
              f"(rollouts.jsonl {ledger:.0f} MB each)")  # fmt: skip
        for compare in ([], [other]):
            t = time.monotonic()
            report = write_report(base, compare)
            took = time.monotonic() - t
            what = "report" if not compare else "report --compare (2 runs)"
            print(f"{what}: {took:.1f}s, {report.size / 1e6:.2f} MB ({report.size:,} bytes)")


if __name__ == "__main__":
    main()
