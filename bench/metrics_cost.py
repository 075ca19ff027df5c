"""What observability costs a run: Prometheus scrapes and the live progress line.

    .venv/bin/python bench/metrics_cost.py [--rollouts 2000] [--concurrency 256] [--repeats 3]
                                           [--variant scripted]

Three figures, each against a baseline measured in the same invocation:

1. one observation on the hot path: ``prometheus_client``'s ``Histogram`` (through
   ``labels()``, and a cached child) against rollgym's ``Latency`` (what the client and the
   agent use), in microseconds;
2. rollouts/s, and the CPU per rollout of every rollgym process, with every process's
   ``/metrics`` scraped once a second by another process (as Prometheus would: the collector's
   on its ``--metrics-port``, the agent's, model's and environment's) against the same
   pipeline not scraped; runs alternate, the ratio is the median of the paired runs;
3. rollouts/s with the progress bar as ``rollgym run`` shows it on a terminal (redrawn into a
   discarded buffer): the bar alone (the bar before the status line; the same code with the
   status line never started) against the bar with the live status line (its ticker, the
   per-hop timing of every record, the servers' ``/stats`` polled every 2 s).

The servers are real processes (``harness.start_pipeline``); the collector runs here. Written
to ``bench/results/metrics_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from harness import Pipeline
from rich.console import Console

from rollgym import runtime
from rollgym.collect import Collector, prepare_run
from rollgym.collect.metrics_port import CollectorMetrics
from rollgym.collect.progress import RunProgress
from rollgym.http import HttpClient
from rollgym.prometheus.latency import Latency

MODES = ("plain", "scraped", "bar", "bar+status")


def micro(n: int = 200_000) -> dict[str, float]:
    """Microseconds per observation."""
    from prometheus_client import CollectorRegistry, Histogram

    hist = Histogram("x_seconds", "x", ["server", "outcome"], registry=CollectorRegistry())
    child = hist.labels("model", "ok")
    ours = Latency()

    def per(fn: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn(0.01)
        return round((time.perf_counter() - t0) / n * 1e6, 3)

    return {
        "prometheus_client labels().observe": per(lambda v: hist.labels("model", "ok").observe(v)),
        "prometheus_client child.observe": per(child.observe),
        "rollgym Latency.observe": per(ours.observe),
    }


SCRAPER = """
import sys, time, urllib.request
ok = 0
try:
    while True:
        for url in sys.argv[1:]:
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
                ok += resp.status == 200
        time.sleep(1.0)
except KeyboardInterrupt:
    print(ok, flush=True)
"""
"""A scraper as Prometheus is one: another process (its CPU is not the run's), every URL once a
second, until interrupted; prints the good scrapes."""


def start_scraper(urls: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SCRAPER, *urls], stdout=subprocess.PIPE, text=True
    )


def stop_scraper(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    return int(out.strip() or 0)


async def one_run(
    pipe: Pipeline, mode: str, tasks: Path, out: Path, concurrency: int
) -> dict[str, Any]:
    assert pipe.config is not None and isinstance(pipe.client, HttpClient)
    collect = pipe.config.collect.model_copy(update={"concurrency": concurrency})
    prepared = prepare_run(pipe.config, collect, tasks, out, resume=False)
    urls = harness.rollgym_urls(pipe)
    bar = mode.startswith("bar")
    collector = Collector(prepared, urls, agent="agent", progress=bar, client=pipe.client)
    if bar:
        # A terminal's bar, drawn into a buffer nobody reads.
        console = Console(file=io.StringIO(), force_terminal=True, width=200)
        collector.progress = collector.recorder.progress = RunProgress(console=console)
        if mode == "bar":
            collector.watch.start_live = lambda *args: None  # type: ignore[method-assign]
    metrics = CollectorMetrics("127.0.0.1", 0) if mode == "scraped" else None
    scraper = None
    if metrics is not None:
        await metrics.server.start()
        metrics.attach(collector)
        scraper = start_scraper([metrics.url] + [u[0] + "/metrics" for u in urls.values()])
    pids = {"collector": os.getpid(), **pipe.pids}
    cpu_before = {name: harness.cpu_seconds(pid) for name, pid in pids.items()}
    scrapes = 0
    try:
        outcome = await collector.execute()
    finally:
        if scraper is not None:
            scrapes = await asyncio.to_thread(stop_scraper, scraper)
        if metrics is not None:
            await metrics.server.close()
    timing = outcome.metrics["timing"]
    cpu = {name: harness.cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    return {
        "cpu_ms_per_rollout": round(1000 * sum(cpu.values()) / prepared.total, 3),
        "rollouts_per_s": timing["rollouts_per_second"],
        "failed": outcome.metrics["counts"]["failed"],
        "collector_cpu_ms_per_rollout": round(1000 * timing["cpu_seconds"] / prepared.total, 3),
        "scrapes": scrapes,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    harness.raise_fd_limit()
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rollouts": args.rollouts,
        "concurrency": args.concurrency,
        "variant": args.variant,
        "micro_us_per_observation": micro(),
    }
    print("one observation, us:", out["micro_us_per_observation"], flush=True)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="rollgym-bench-metrics-") as tmp:
        work = Path(tmp)
        tasks = harness.write_tasks(work / "tasks.jsonl", args.rollouts)
        warm = harness.write_tasks(work / "warm.jsonl", args.warmup)
        pipe = await harness.start_pipeline("rollgym", args.variant, log_dir=work / "logs")
        try:
            await one_run(pipe, "plain", warm, work / "warm", args.concurrency)
            for i in range(args.repeats):
                order = MODES if i % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    run = await one_run(pipe, mode, tasks, work / f"{mode}-{i}", args.concurrency)
                    runs[mode].append(run)
                    print(
                        f"run {i + 1}/{args.repeats} {mode:<11}: {run['rollouts_per_s']:8.1f} "
                        f"rollouts/s, CPU ms/rollout: all {run['cpu_ms_per_rollout']:.3f}, "
                        f"collector {run['collector_cpu_ms_per_rollout']:.3f}; "
                        f"{run['failed']} failed, {run['scrapes']} scrapes",
                        flush=True,
                    )
        finally:
            await pipe.stop()

    def paired(a: str, b: str, key: str = "rollouts_per_s") -> float:
        ratios = sorted(x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True))
        return round(ratios[len(ratios) // 2], 3)

    out["runs"] = runs
    out["median_rollouts_per_s"] = {
        m: round(statistics.median(r["rollouts_per_s"] for r in runs[m]), 1) for m in MODES
    }
    out["median_cpu_ms_per_rollout"] = {
        m: round(statistics.median(r["cpu_ms_per_rollout"] for r in runs[m]), 3) for m in MODES
    }
    pairs = {
        "scraped every second / not scraped": ("scraped", "plain"),
        "bar with status line / bar alone": ("bar+status", "bar"),
        "bar alone / no bar": ("bar", "plain"),
    }
    out["ratios"] = {what: paired(a, b) for what, (a, b) in pairs.items()}
    out["cpu_ratios"] = {what: paired(a, b, "cpu_ms_per_rollout") for what, (a, b) in pairs.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=512)
    parser.add_argument("--variant", default="scripted", choices=harness.VARIANTS)
    args = parser.parse_args()
    results = runtime.run(main_async(args))
    print(f"\n{args.rollouts} rollouts per run, concurrency {args.concurrency}, {args.variant}")
    for mode, rate in results["median_rollouts_per_s"].items():
        cpu = results["median_cpu_ms_per_rollout"][mode]
        print(
            f"  {mode:<11} {rate:8.1f} rollouts/s, {cpu:.3f} CPU ms per rollout (every "
            f"process; medians of {args.repeats})"
        )
    for what, ratio in results["ratios"].items():
        cpu = results["cpu_ratios"][what]
        print(f"  {what}: rollouts/s x{ratio:.3f}, CPU per rollout x{cpu:.3f} (paired medians)")
    path = harness.save_json("metrics_cost.json", results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
