"""Soak benchmark: thousands of rollouts under injected faults, and time to abort.

    .venv/bin/python bench/soak.py [--rollouts 5000] [--concurrency 512] [--quick]

1. Soak: the echo environment with the scripted model behind the chaos proxy answering 503 to a
   seeded 10% of model calls and resetting 1% of connections (half before, half after the
   request reached the model). Reports rollouts ok / failed / lost / duplicated (lost and
   duplicated must be 0) and HTTP attempts per model request (from the agent's ``/stats``).
2. Abort: the same run against a model that always answers 500, with
   ``--max-failure-rate 0.5`` after 20 samples: seconds from the first dispatch to the abort.

Everything runs on 127.0.0.1; every run is bounded by its rollout count and deadlines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect import Collector, prepare_run
from rollgym.config import Config, parse_config
from rollgym.launch import Supervisor

RESULTS = Path(__file__).resolve().parent / "results"
FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.1}


def write_tasks(path: Path, n_tasks: int) -> None:
    with path.open("w") as fh:
        for i in range(n_tasks):
            script = [{"call": "echo", "arguments": {"text": f"v{i}"}}, {"say": "{tool_output}"}]
            row = {
                "responses_create_params": {
                    "input": f"echo v{i}",
                    "metadata": {"rollgym_script": json.dumps(script)},
                },
                "expected_answer": f"v{i}",
            }
            fh.write(json.dumps(row) + "\n")


def config(chaos: dict[str, Any], **collect: Any) -> Config:
    return parse_config(
        {
            "servers": {
                "model": {"kind": "model", "impl": "scripted", "retry": FAST_RETRY, "chaos": chaos},
                "env": {"kind": "resources", "impl": "echo", "retry": FAST_RETRY},
                "agent": {
                    "kind": "agent",
                    "impl": "tool_agent",
                    "options": {"model": "model", "resources": "env"},
                },
            },
            "collect": collect,
        },
        "bench/soak.py",
    )


def ledger_audit(out: Path) -> dict[str, int]:
    expected = {
        (r["task_index"], r["rollout_index"])
        for r in map(orjson.loads, (out / "tasks.jsonl").read_bytes().splitlines())
    }
    seen: list[tuple[int, int]] = []
    counts = {}
    for name in ("rollouts", "failures"):
        path = out / f"{name}.jsonl"
        lines = path.read_bytes().splitlines() if path.exists() else []
        counts[name] = len(lines)
        seen.extend((r["task_index"], r["rollout_index"]) for r in map(orjson.loads, lines))
    return {
        "total": len(expected),
        "ok": counts["rollouts"],
        "failed": counts["failures"],
        "lost": len(expected - set(seen)),
        "duplicated": len(seen) - len(set(seen)),
    }


async def timed_run(
    workdir: Path, name: str, cfg: Config, rollouts: int, repeats: int
) -> tuple[Any, float, Path]:
    """Start the config's servers, collect ``rollouts``; (outcome, seconds collecting, out)."""
    tasks = workdir / f"{name}_tasks.jsonl"
    write_tasks(tasks, max(1, rollouts // repeats))
    out = workdir / name
    prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
    supervisor = Supervisor(cfg, log_dir=out / "logs")
    try:
        urls = await supervisor.start()
        started = time.monotonic()
        outcome = await Collector(prepared, urls, progress=False).execute()
        return outcome, time.monotonic() - started, out
    finally:
        await supervisor.stop()


async def soak(workdir: Path, rollouts: int, concurrency: int) -> dict[str, Any]:
    chaos = {
        "seed": 2026,
        "paths": ["/v1/responses"],
        "faults": [
            {"kind": "status", "status": 503, "rate": 0.10},
            {"kind": "reset_before", "rate": 0.005},
            {"kind": "reset_after", "rate": 0.005},
        ],
    }
    repeats = 50
    cfg = config(chaos, concurrency=concurrency, repeats=repeats, rollout_timeout=120)
    outcome, wall, out = await timed_run(workdir, "soak", cfg, rollouts, repeats)
    # The agent's own counters for its model calls, gathered by the collector at the end.
    model = outcome.metrics["servers"].get("agent", {}).get("model", {})
    audit = ledger_audit(out)
    return {
        **audit,
        "wall_seconds": round(wall, 2),
        "rollouts_per_second": round(audit["total"] / wall, 1),
        "model_calls": model.get("calls"),
        "model_attempts": model.get("attempts"),
        "attempts_per_model_request": round(model["attempts"] / model["calls"], 4)
        if model
        else None,
        "model_retries": model.get("retries"),
        "budget_refused": model.get("budget_refused"),
        "failures_by_type": outcome.metrics["failures"]["by_type"],
    }


async def abort_time(workdir: Path, rollouts: int, concurrency: int) -> dict[str, Any]:
    chaos = {
        "seed": 1,
        "paths": ["/v1/responses"],
        "faults": [{"kind": "status", "status": 500, "rate": 1.0}],
    }
    repeats = 50
    cfg = config(
        chaos,
        concurrency=concurrency,
        repeats=repeats,
        max_failure_rate=0.5,
        min_failure_samples=20,
    )
    outcome, elapsed, _ = await timed_run(workdir, "abort", cfg, rollouts, repeats)
    return {
        "seconds_to_abort": round(elapsed, 3),
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "reason": outcome.abort_reason,
        "recorded_before_abort": outcome.metrics["counts"]["failed"],
        "of_total": outcome.metrics["counts"]["total"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="1,000 rollouts at concurrency 128")
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.concurrency = 1000, 128
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))  # many sockets at once
    with tempfile.TemporaryDirectory(prefix="rollgym-soak-") as tmp:
        workdir = Path(tmp)
        results = {
            "soak": asyncio.run(soak(workdir, args.rollouts, args.concurrency)),
            "abort": asyncio.run(abort_time(workdir, args.rollouts, args.concurrency)),
            "rollouts": args.rollouts,
            "concurrency": args.concurrency,
        }
    s, a = results["soak"], results["abort"]
    print(
        f"soak: {s['total']} rollouts at concurrency {args.concurrency}, 10% 503 + 1% resets on model calls"
    )
    print(f"  ok {s['ok']}  failed {s['failed']}  lost {s['lost']}  duplicated {s['duplicated']}")
    print(
        f"  model requests {s['model_calls']}, attempts {s['model_attempts']} "
        f"({s['attempts_per_model_request']} per request), budget refusals {s['budget_refused']}"
    )
    print(f"  failures by type {s['failures_by_type']}; {s['rollouts_per_second']} rollouts/s")
    print(
        f"abort: always-500 model, --max-failure-rate 0.5: aborted in {a['seconds_to_abort']}s "
        f"after {a['recorded_before_abort']} of {a['of_total']} rollouts (exit {a['exit_code']})"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(results, indent=2))
    ok = s["lost"] == 0 and s["duplicated"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
