"""Throughput of rollgym's full pipeline against bare aiohttp processes doing the same hops.

    .venv/bin/python bench/throughput.py [--rollouts 2000] [--concurrency 256] [--repeats 3]
                                         [--sustain 35] [--profile]

For each variant (``scripted``: the scripted model; ``proxy``: the ``openai_proxy`` model server
in front of the instant upstream of ``bare.py``) it starts rollgym's servers and the bare
baseline side by side, warms both up, then times ``--rollouts`` rollouts of the echo
environment (one tool call each) on each, alternating, ``--repeats`` times; the median is
reported, so a noisy neighbour hurts both pipelines alike. rollgym's collector and the bare
client run in this process.

Printed and written to ``bench/results/throughput.json``: rollouts/s and the ratio
rollgym/bare; CPU ms per rollout of every process (psutil, over each timed window; the
upstream is the stand-in for the model and is left out of the framework sum); requests per
rollout, counted three ways: by a counting pass (rollgym's servers plus a request counter,
``counting.py``; the timed runs use the stock servers), by the stock servers' own client
``/stats`` during the timed runs, and by the bare servers' counters.

``--sustain S`` then runs rollgym's ``--sustain-variant`` pipeline for S seconds and prints the
rate in slices: state that grows with the request rate (a circuit breaker's window, say) only
shows once the run is longer than that window. ``--profile`` records every rollgym process with
py-spy during the first timed run of each variant and during the sustained run
(``bench/results/profile/``) and prints the top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import profiling
from harness import Pipeline

from rollgym import runtime
from rollgym.collect import Collector, prepare_run
from rollgym.http import HttpClient

ORDER = ("collector", "agent", "model", "echo", "upstream")


async def client_calls(pipe: Pipeline) -> dict[str, int]:
    """Requests sent so far, by sender -> target, from rollgym's own client counters."""
    out: dict[str, int] = {}
    if isinstance(pipe.client, HttpClient):
        for target, st in pipe.client.stats().items():
            out[f"collector -> {target}"] = st.attempts
    for name in ("agent", "model"):
        data = await harness.get_json(pipe.urls[name] + "/stats")
        for target, st in (data.get("calls") or {}).items():
            out[f"{name} -> {target}"] = st["attempts"]
    return out


async def server_counts(pipe: Pipeline) -> dict[str, Any]:
    """The request counters of the bare processes (all of them, or rollgym's upstream)."""
    names = [n for n in pipe.urls if pipe.kind == "bare" or n == "upstream"]
    return {name: await harness.stats_of(pipe.urls[name]) for name in names}


async def timed_run(
    pipe: Pipeline, tasks: Path, out_dir: Path, concurrency: int, profile_tag: str | None
) -> dict[str, Any]:
    counts_before = await server_counts(pipe)
    calls_before = await client_calls(pipe) if pipe.kind == "rollgym" else {}
    spies = profiling.start(pipe.pids, harness.RESULTS_DIR / "profile", profile_tag) if (
        profile_tag
    ) else []  # fmt: skip
    try:
        result, cpu = await harness.measured_collect(pipe, tasks, out_dir, concurrency)
    finally:
        profiles = profiling.stop(spies)
    counts_after = await server_counts(pipe)
    n = result.succeeded or 1
    counted = {
        f"{name} {path}": c / n
        for name in sorted(counts_after)
        for path, c in sorted(harness.diff_counts(counts_before[name], counts_after[name]).items())
    }
    sent: dict[str, float] = {}
    if pipe.kind == "rollgym":
        calls_after = await client_calls(pipe)
        sent = {k: (v - calls_before.get(k, 0)) / n for k, v in calls_after.items()}
        sent = {k: v for k, v in sent.items() if v}
    return {
        "rollouts": result.rollouts,
        "succeeded": result.succeeded,
        "failed": result.failed,
        "wall_s": round(result.wall_s, 3),
        "rollouts_per_s": round(result.rate, 1),
        "cpu_ms_per_rollout": {k: round(1000 * v / result.rollouts, 3) for k, v in cpu.items()},
        "server_counted_per_rollout": counted,
        "client_sent_per_rollout": sent,
        "profiles": profiles,
    }


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu_names = runs[0]["cpu_ms_per_rollout"]
    cpu = {
        k: round(statistics.median(r["cpu_ms_per_rollout"][k] for r in runs), 3) for k in cpu_names
    }
    framework = round(sum(v for k, v in cpu.items() if k != "upstream"), 3)
    return {
        "rollouts_per_s": round(statistics.median(r["rollouts_per_s"] for r in runs), 1),
        "rollouts_per_s_all": [r["rollouts_per_s"] for r in runs],
        "failed": sum(r["failed"] for r in runs),
        "cpu_ms_per_rollout": cpu,
        "framework_cpu_ms_per_rollout": framework,
        "runs": runs,
    }


async def run_variant(
    variant: str, args: argparse.Namespace, work: Path, tasks: Path, warm: Path
) -> dict[str, Any]:
    print(f"[{variant}] counting rollgym's requests per rollout ...", flush=True)
    count_tasks = harness.write_tasks(work / f"count-{variant}.jsonl", 200)
    counted = await harness.count_hops(variant, count_tasks, work / f"count-{variant}")
    pipes: dict[str, Pipeline] = {}
    runs: dict[str, list[dict[str, Any]]] = {"rollgym": [], "bare": []}
    try:
        for kind in ("rollgym", "bare"):
            pipes[kind] = await harness.start_pipeline(kind, variant, log_dir=work / "logs")
            await harness.collect(pipes[kind], warm, work / f"{kind}-{variant}-warm", 256)
        for i in range(args.repeats):
            order = ("rollgym", "bare") if i % 2 == 0 else ("bare", "rollgym")
            for kind in order:
                tag = f"{variant}" if (args.profile and i == 0 and kind == "rollgym") else None
                out = work / f"{kind}-{variant}-{i}"
                run = await timed_run(pipes[kind], tasks, out, args.concurrency, tag)
                runs[kind].append(run)
                print(
                    f"[{variant}] run {i + 1}/{args.repeats} {kind:<7}: "
                    f"{run['rollouts_per_s']:7.1f} rollouts/s, {run['failed']} failed",
                    flush=True,
                )
    finally:
        for pipe in pipes.values():
            await pipe.stop()
    entry: dict[str, Any] = {kind: summarize_runs(r) for kind, r in runs.items()}
    # The median of the ratios of paired runs (each pair ran back to back), which a noisy
    # machine disturbs less than a ratio of two medians taken from different moments.
    paired = sorted(
        g["rollouts_per_s"] / b["rollouts_per_s"]
        for g, b in zip(runs["rollgym"], runs["bare"], strict=True)
    )
    entry["ratio"] = round(paired[len(paired) // 2], 3)
    entry["paired_ratios"] = [round(r, 3) for r in paired]
    entry["requests_per_rollout"] = {
        "rollgym_counting_pass": counted,
        "rollgym_client_stats": runs["rollgym"][0]["client_sent_per_rollout"],
        "rollgym_upstream_counter": runs["rollgym"][0]["server_counted_per_rollout"],
        "bare_server_counters": runs["bare"][0]["server_counted_per_rollout"],
    }
    return entry


async def sustained(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """rollgym's pipeline for ``args.sustain`` seconds; rate and CPU per slice."""
    variant = args.sustain_variant
    print(f"[sustained] rollgym {variant}: {args.sustain:g}s at {args.concurrency} ...", flush=True)
    tasks = harness.write_tasks(work / "sustain.jsonl", args.sustain_rows)
    pipe = await harness.start_pipeline("rollgym", variant, log_dir=work / "logs")
    spies: list[Any] = []
    try:
        assert pipe.config is not None and isinstance(pipe.client, HttpClient)
        collect = pipe.config.collect.model_copy(update={"concurrency": args.concurrency})
        prepared = prepare_run(pipe.config, collect, tasks, work / "sustain", resume=False)
        urls = harness.rollgym_urls(pipe)
        collector = Collector(prepared, urls, agent="agent", progress=False, client=pipe.client)
        pids = {"collector": os.getpid(), **pipe.pids}
        if args.profile:
            spies = profiling.start(pipe.pids, harness.RESULTS_DIR / "profile", "sustained")
        running = asyncio.create_task(collector.execute())
        slices: list[dict[str, Any]] = []
        t0 = last_t = time.monotonic()
        last_n = 0
        last_cpu = {k: harness.cpu_seconds(p) for k, p in pids.items()}
        while time.monotonic() - t0 < args.sustain and not running.done():
            await asyncio.sleep(args.slice)
            now, n = time.monotonic(), collector.recorder.recorded
            cpu = {k: harness.cpu_seconds(p) for k, p in pids.items()}
            done = max(1, n - last_n)
            slices.append(
                {
                    "t": round(now - t0, 1),
                    "rollouts_per_s": round((n - last_n) / (now - last_t), 1),
                    "cpu_ms_per_rollout": {
                        k: round(1000 * (cpu[k] - last_cpu[k]) / done, 3) for k in cpu
                    },
                }
            )
            s = slices[-1]
            print(
                f"[sustained] t={s['t']:5.1f}s {s['rollouts_per_s']:7.1f} rollouts/s, CPU ms "
                + " ".join(f"{k} {s['cpu_ms_per_rollout'][k]:.2f}" for k in ORDER if k in cpu),
                flush=True,
            )
            last_t, last_n, last_cpu = now, n, cpu
        quiet = logging.getLogger("rollgym.collect")
        quiet.disabled = True  # the abort below is ours, not an error
        collector.abort("benchmark time is up")
        outcome = await running
        quiet.disabled = False
    finally:
        profiles = profiling.stop(spies)
        await pipe.stop()
    failed = outcome.metrics["counts"]["failed"]
    return {"variant": variant, "slices": slices, "failed": failed, "profiles": profiles}


def _cpu_text(cpu: dict[str, float]) -> str:
    return "  ".join(f"{k} {cpu[k]:.2f}" for k in ORDER if k in cpu)


def print_table(results: dict[str, Any]) -> None:
    print(
        f"\n{results['rollouts']} rollouts per run, concurrency {results['concurrency']}, "
        f"median of {results['repeats']} alternating runs"
    )
    print(
        f"{'variant':<9} {'pipeline':<8} {'rollouts/s':>10} {'ratio':>6} {'req/rollout':>11} "
        f"{'framework CPU':>13}  CPU ms per rollout by process"
    )
    for variant, entry in results["variants"].items():
        reqs = entry["requests_per_rollout"]
        totals = {
            "rollgym": reqs["rollgym_counting_pass"]["total"],
            "bare": sum(reqs["bare_server_counters"].values()),
        }
        for kind in ("rollgym", "bare"):
            r = entry[kind]
            ratio = f"{entry['ratio']:.2f}" if kind == "rollgym" else ""
            print(
                f"{variant:<9} {kind:<8} {r['rollouts_per_s']:>10.1f} {ratio:>6} "
                f"{totals[kind]:>11.2f} {r['framework_cpu_ms_per_rollout']:>10.2f} ms  "
                f"{_cpu_text(r['cpu_ms_per_rollout'])}"
            )
    for variant, entry in results["variants"].items():
        reqs = entry["requests_per_rollout"]
        print(f"\nrequests per rollout, {variant}:")
        hops = reqs["rollgym_counting_pass"]["per_rollout"]
        print("  rollgym, counting pass: " + ", ".join(f"{k} {v:g}" for k, v in hops.items()))
        sent = {**reqs["rollgym_client_stats"], **reqs["rollgym_upstream_counter"]}
        print(
            "  rollgym, timed run (clients' /stats + upstream counter): "
            f"{sum(v for k, v in sent.items() if '->' in k):.2f} sent: "
            + ", ".join(f"{k} {v:g}" for k, v in sent.items())
        )
        bare = reqs["bare_server_counters"]
        print(
            f"  bare, timed run (server counters): {sum(bare.values()):.2f}: "
            + ", ".join(f"{k} {v:g}" for k, v in bare.items())
        )
    sus = results.get("sustained")
    if sus:
        print(f"\nsustained rollgym {sus['variant']} ({sus['failed']} failed):")
        for s in sus["slices"]:
            # No "of bare" here: the bare rate was measured at another moment.
            print(
                f"  t={s['t']:5.1f}s {s['rollouts_per_s']:7.1f} rollouts/s  "
                f"CPU ms/rollout {_cpu_text(s['cpu_ms_per_rollout'])}"
            )
    print(
        "\nframework CPU: all processes but the instant upstream (the model's stand-in). "
        "Collectors (rollgym's, and the bare client) run in this process."
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    nofile = harness.raise_fd_limit()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rollouts": args.rollouts,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "rlimit_nofile": nofile,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="rollgym-bench-") as tmp:
        work = Path(tmp)
        tasks = harness.write_tasks(work / "tasks.jsonl", args.rollouts)
        warm = harness.write_tasks(work / "warm.jsonl", args.warmup)
        for variant in variants:
            out["variants"][variant] = await run_variant(variant, args, work, tasks, warm)
        if args.sustain > 0:
            out["sustained"] = await sustained(args, work)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=2000, help="timed rollouts per run")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per pipeline")
    parser.add_argument("--warmup", type=int, default=512, help="untimed rollouts first")
    parser.add_argument("--variants", default="scripted,proxy")
    parser.add_argument("--sustain", type=float, default=35.0, help="seconds; 0 skips it")
    parser.add_argument("--sustain-variant", default="proxy", choices=harness.VARIANTS)
    parser.add_argument("--sustain-rows", type=int, default=120_000, help="task rows available")
    parser.add_argument("--slice", type=float, default=5.0, help="seconds per sustained slice")
    parser.add_argument("--profile", action="store_true", help="py-spy the rollgym processes")
    args = parser.parse_args()
    results = runtime.run(main_async(args))  # uvloop, as `rollgym run` has it
    print_table(results)
    if args.profile:
        for variant, entry in results["variants"].items():
            profiling.print_top(entry["rollgym"]["runs"][0]["profiles"], variant)
        if "sustained" in results:
            profiling.print_top(results["sustained"]["profiles"], "sustained")
    path = harness.save_json("throughput.json", results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
