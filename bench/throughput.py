"""Throughput of rollgym's full pipeline against bare aiohttp processes doing the same hops.

    .venv/bin/python bench/throughput.py [--rollouts 2000] [--concurrency 256] [--profile]

For each variant (``scripted``: the scripted model; ``proxy``: the ``openai_proxy`` model server
in front of an instant upstream) it starts rollgym's servers (collector in this process), warms
them up, and times ``--rollouts`` rollouts of the echo environment (one tool call each); then
it does the same with the bare baseline of ``bare.py``. A separate counting pass (rollgym's
servers with a request counter, ``counting.py``) gives rollgym's requests per rollout; the bare
servers count their own. Prints rollouts/s, the ratio rollgym/bare, CPU ms per rollout of every
process (psutil, over the timed window) and requests per rollout; writes
``bench/results/throughput.json``. ``--profile`` also records py-spy profiles of every process
of the rollgym runs (``bench/results/profile/``) and prints their top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import profiling


def _cpu_row(cpu: dict[str, float], rollouts: int) -> dict[str, float]:
    return {name: round(1000 * sec / rollouts, 3) for name, sec in cpu.items()}


async def run_variant(
    kind: str, variant: str, args: argparse.Namespace, work: Path, tasks: Path, warm: Path
) -> dict[str, Any]:
    pipe = await harness.start_pipeline(kind, variant)
    spies: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    try:
        await harness.collect(pipe, warm, work / f"{kind}-{variant}-warm", args.concurrency)
        counted = [n for n in pipe.urls if kind == "bare" or n == "upstream"]
        before = {name: await harness.stats_of(pipe.urls[name]) for name in counted}
        if args.profile and kind == "rollgym":
            spies = profiling.start(pipe.pids, harness.RESULTS_DIR / "profile", variant)
        result, cpu = await harness.measured_collect(
            pipe, tasks, work / f"{kind}-{variant}", args.concurrency
        )
        profiles = profiling.stop(spies)
        after = {name: await harness.stats_of(pipe.urls[name]) for name in counted}
    finally:
        profiling.stop(spies)
        await pipe.stop()
    per_rollout = {
        f"{name} {path}": n / result.succeeded
        for name in sorted(after)
        for path, n in sorted(harness.diff_counts(before[name], after[name]).items())
    }
    framework = sum(sec for name, sec in cpu.items() if name != "upstream")
    return {
        "kind": kind,
        "variant": variant,
        "rollouts": result.rollouts,
        "succeeded": result.succeeded,
        "failed": result.failed,
        "wall_s": round(result.wall_s, 3),
        "rollouts_per_s": round(result.rate, 1),
        "cpu_ms_per_rollout": _cpu_row(cpu, result.rollouts),
        "framework_cpu_ms_per_rollout": round(1000 * framework / result.rollouts, 3),
        "requests_counted_in_timed_run": per_rollout,
        "profiles": profiles,
    }


def _fmt_cpu(row: dict[str, float]) -> str:
    order = ("collector", "agent", "model", "echo", "upstream")
    return "  ".join(f"{k} {row[k]:.2f}" for k in order if k in row)


def print_table(results: dict[str, Any]) -> None:
    print()
    print(
        f"{'variant':<9} {'pipeline':<8} {'rollouts/s':>10} {'ratio':>6} {'req/rollout':>11} "
        f"{'CPU ms/rollout (framework)':>27}  per process (ms/rollout)"
    )
    for variant, entry in results["variants"].items():
        for kind in ("rollgym", "bare"):
            r = entry[kind]
            ratio = f"{entry['ratio']:.2f}" if kind == "rollgym" else ""
            print(
                f"{variant:<9} {kind:<8} {r['rollouts_per_s']:>10.1f} {ratio:>6} "
                f"{entry['requests_per_rollout'][kind]:>11.2f} "
                f"{r['framework_cpu_ms_per_rollout']:>27.2f}  {_fmt_cpu(r['cpu_ms_per_rollout'])}"
            )
    print()
    for variant, entry in results["variants"].items():
        print(f"requests per rollout, {variant}:")
        for kind in ("rollgym", "bare"):
            hops = entry["hops"][kind]
            listed = ", ".join(f"{k} {v:g}" for k, v in hops.items())
            print(f"  {kind:<8} {sum(hops.values()):.2f}: {listed}")
    print(
        "\nframework CPU = all processes but the instant upstream (the stand-in for the model). "
        "rollgym's requests are counted in a separate pass with counting servers; the timed "
        "runs use the stock servers."
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    harness.raise_fd_limit()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "rollouts": args.rollouts,
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="rollgym-bench-") as tmp:
        work = Path(tmp)
        tasks = harness.write_tasks(work / "tasks.jsonl", args.rollouts)
        warm = harness.write_tasks(work / "warm.jsonl", args.warmup)
        count_tasks = harness.write_tasks(work / "count.jsonl", 200)
        for variant in variants:
            print(f"[{variant}] counting rollgym's requests per rollout ...", flush=True)
            counted = await harness.count_hops(variant, count_tasks, work / f"count-{variant}")
            entry: dict[str, Any] = {}
            for kind in ("rollgym", "bare"):
                print(f"[{variant}] {kind}: {args.rollouts} rollouts ...", flush=True)
                entry[kind] = await run_variant(kind, variant, args, work, tasks, warm)
                r = entry[kind]
                print(
                    f"[{variant}] {kind}: {r['rollouts_per_s']} rollouts/s, "
                    f"{r['failed']} failed",
                    flush=True,
                )
            rollgym_hops = dict(counted["per_rollout"])
            for key, value in entry["rollgym"]["requests_counted_in_timed_run"].items():
                rollgym_hops.setdefault(key, value)
            entry["hops"] = {
                "rollgym": rollgym_hops,
                "bare": entry["bare"]["requests_counted_in_timed_run"],
            }
            entry["requests_per_rollout"] = {k: sum(v.values()) for k, v in entry["hops"].items()}
            entry["ratio"] = entry["rollgym"]["rollouts_per_s"] / entry["bare"]["rollouts_per_s"]
            out["variants"][variant] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000, help="timed rollouts per run")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=512, help="untimed rollouts first")
    parser.add_argument("--variants", default="scripted,proxy")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy every rollgym process in the timed run"
    )
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    print_table(results)
    if args.profile:
        for variant, entry in results["variants"].items():
            profiling.print_top(entry["rollgym"]["profiles"], variant)
    path = harness.save_json("throughput.json", results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
