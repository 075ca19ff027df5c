"""Soak benchmark: thousands of rollouts under injected faults, and time to abort.

    .venv/bin/python bench/soak.py [--rollouts 5000] [--concurrency 512] [--quick]

1. Soak: the echo environment with the scripted model behind the chaos proxy answering 503 to a
   seeded 10% of model calls and resetting 1% of connections (half before, half after the
   request reached the model). Reports rollouts ok / failed / lost / duplicated (lost and
   duplicated must be 0) and HTTP attempts per model request (from the agent's ``/stats``).
2. Abort: the same run against a model that always answers 500, with
   ``--max-failure-rate 0.5`` after 20 samples: seconds from the first dispatch to the abort.
3. Outage: default settings, concurrency 64; the model answers normally for as many model
   requests as the run has tasks, then goes down for good (503 on every call). Seconds from its
   first failure to the end of the aborted run, at two run sizes (500 and 2,000 tasks): the
   bound must not grow with the run's history.

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
                    "options": {"model": "model", "resources": "env", "tools_from_server": True},
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


class ModelSwitch:
    """A proxy in front of the model that answers ``up_for`` requests, then 503 for good."""

    def __init__(self, up_for: int) -> None:
        self.up_for = up_for
        self.seen = 0
        self.upstream = ""
        self.first_fault: float | None = None
        self._session: Any = None

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        self.seen += 1
        if self.seen > self.up_for:
            if self.first_fault is None:
                self.first_fault = time.monotonic()
            return web.json_response({"error": {"message": "upstream is down"}}, status=503)
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-")}
        headers["content-type"] = "application/json"
        async with self._session.post(self.upstream + request.path, data=body,
                                      headers=headers) as resp:  # fmt: skip
            return web.Response(body=await resp.read(), status=resp.status,
                                content_type="application/json")  # fmt: skip


async def outage(workdir: Path, tasks: int, concurrency: int = 64) -> dict[str, Any]:
    import aiohttp
    from aiohttp import web

    switch = ModelSwitch(up_for=tasks)
    app = web.Application()
    app.router.add_post("/{tail:.*}", switch.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    switch_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    cfg = parse_config(
        {
            "servers": {
                "upstream": {"kind": "model", "impl": "scripted"},
                "model": {"kind": "model", "impl": "scripted", "url": switch_url},
                "env": {"kind": "resources", "impl": "echo"},
                "agent": {"kind": "agent", "impl": "tool_agent",
                          "options": {"model": "model", "resources": "env", "tools_from_server": True}},
            },
            "collect": {"concurrency": concurrency},
        },
        "bench/soak.py outage",
    )  # fmt: skip
    path = workdir / f"outage{tasks}_tasks.jsonl"
    write_tasks(path, tasks)
    out = workdir / f"outage{tasks}"
    prepared = prepare_run(cfg, cfg.collect, path, out, resume=False)
    supervisor = Supervisor(cfg, log_dir=out / "logs")
    try:
        async with aiohttp.ClientSession() as session:
            switch._session = session
            urls = await supervisor.start()
            switch.upstream = urls["upstream"][0]
            outcome = await Collector(prepared, urls, progress=False).execute()
            ended = time.monotonic()
    finally:
        await supervisor.stop()
        await runner.cleanup()
    counts = outcome.metrics["counts"]
    return {
        "tasks": tasks,
        "good_model_requests": tasks,
        "status": outcome.status,
        "reason": outcome.abort_reason,
        "seconds_from_first_fault_to_end": (
            round(ended - switch.first_fault, 2) if switch.first_fault else None
        ),
        "succeeded": counts["succeeded"],
        "failed": counts["failed"],
        "pending": counts["pending"],
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
            "outage": [asyncio.run(outage(workdir, n)) for n in (500, 2000)],
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
    for o in results["outage"]:
        print(
            f"outage: model down for good after {o['good_model_requests']} good requests "
            f"({o['tasks']} tasks, concurrency 64, defaults): run {o['status']} "
            f"{o['seconds_from_first_fault_to_end']}s after the first fault "
            f"({o['succeeded']} ok, {o['failed']} failed, {o['pending']} left for --resume); "
            f"{o['reason']}"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(results, indent=2))
    ok = s["lost"] == 0 and s["duplicated"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
