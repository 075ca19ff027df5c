"""The benchmark suite: issue 15's targets, then throughput, latency, memory, start-up, ceiling.

    .venv/bin/python bench/suite.py [--only targets,throughput,latency,memory,startup,ceiling]
                                    [--quick]

Each figure comes with a baseline measured in the same invocation (bare aiohttp processes of
``bare.py``). Prints one section per benchmark and writes ``bench/results/suite.json``.

- targets: ``targets.py`` (see there): the topology of NeMo Gym against bare aiohttp making its 9
  hops, 256 against 4,096 in flight, ``--help`` and ``serve`` times; its verdicts are printed
  again at the very end.
- throughput: ``throughput.py`` (see there); ``--quick`` runs one repeat and no sustained run.
- latency: concurrency 1, the ``proxy`` and ``scripted`` pipelines: median and p99 of the
  per-rollout wall time, and of that minus the instant upstream's own time (2 calls x its
  median round trip measured directly from this process; its handler time is also shown).
- memory: peak RSS (``VmHWM`` at exit, via ``peak.py``) of ``rollgym collect`` in a
  subprocess: 2,000 rollouts on the real pipeline, then 2,000 and 200,000 rollouts (20,000 with
  ``--quick``)
  streamed from a file against ``bare.py instant_agent`` (a stand-in answering ``/run`` at once,
  so 200,000 rollouts take a minute or two, not an hour: the collector's memory does not depend
  on what is behind ``/run``). The bare collector (``bare.py collect``) is the baseline.
- startup: ``rollgym serve`` until its ``--write-urls`` file exists (all servers healthy), and
  ``rollgym run`` until the agent receives its first ``/run`` (counting servers log the first
  request per path); baselines: the bare servers to READY, and ``rollgym --help``.
- ceiling: rollouts/s and failures at concurrency 256, 1,024 and 4,096 for both pipelines.
  RLIMIT_NOFILE's soft limit is raised to the hard limit first (children inherit it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import harness
import orjson
import psutil
import targets
import throughput

from rollgym import runtime

BENCHMARKS = ("targets", "throughput", "latency", "memory", "startup", "ceiling")
ROLLGYM = str(Path(sys.executable).with_name("rollgym"))
PEAK = harness.BENCH_DIR / "peak.py"


def pct(values: list[float], q: float) -> float:
    return harness.percentile(values, q)


def ms(x: float) -> float:
    return round(1000 * x, 3)


def write_config(path: Path, variant: str, upstream: str | None, counting: bool = False) -> Path:
    cfg = harness.rollgym_config(variant, upstream, counting=counting)
    data = cfg.model_dump(mode="json", exclude={"source"})
    path.write_bytes(orjson.dumps(data))  # JSON is YAML
    return path


# -- 1. throughput -------------------------------------------------------------------------


async def bench_throughput(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    targs = argparse.Namespace(
        rollouts=2000,
        concurrency=256,
        repeats=1 if args.quick else 3,
        warmup=512,
        variants="scripted,proxy",
        sustain=0.0 if args.quick else 35.0,
        sustain_variant="proxy",
        sustain_rows=120_000,
        slice=5.0,
        profile=False,
    )
    results = await throughput.main_async(targs)
    throughput.print_table(results)
    return results


# -- 2. latency ----------------------------------------------------------------------------


async def upstream_rtt(url: str, n: int) -> list[float]:
    """Round trips of a first-turn chat request to the upstream, sequential."""
    body = orjson.dumps(
        {
            "messages": [{"role": "user", "content": "echo-0"}],
            "tools": [{"type": "function", "function": {"name": "echo", "parameters": {}}}],
        }
    )
    times = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n + 20):
            t0 = time.perf_counter()
            async with session.post(
                url + "/v1/chat/completions",
                data=body,
                headers={"content-type": "application/json"},
            ) as resp:
                await resp.read()
            times.append(time.perf_counter() - t0)
    return times[20:]


async def bench_latency(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    n = 200 if args.quick else 1000
    tasks = harness.write_tasks(work / "lat.jsonl", n)
    warm = harness.write_tasks(work / "lat-warm.jsonl", 50)
    out: dict[str, Any] = {"rollouts": n, "concurrency": 1}
    for variant in ("proxy", "scripted"):
        entry: dict[str, Any] = {}
        for kind in ("rollgym", "bare"):
            pipe = await harness.start_pipeline(kind, variant, log_dir=work / "logs")
            try:
                await harness.collect(pipe, warm, work / f"lat-{kind}-{variant}-warm", 1)
                model_s = 0.0
                handler = None
                if "upstream" in pipe.urls:
                    before = await harness.stats_of(pipe.urls["upstream"])
                    rtt = await upstream_rtt(pipe.urls["upstream"], 200)
                    model_s = 2 * statistics.median(rtt)
                res = await harness.collect(
                    pipe, tasks, work / f"lat-{kind}-{variant}", 1, durations=True
                )
                if "upstream" in pipe.urls:
                    after = await harness.stats_of(pipe.urls["upstream"])
                    calls = sum(harness.diff_counts(before, after).values())
                    handler = (after["handler_s"] - before["handler_s"]) / max(1, calls)
            finally:
                await pipe.stop()
            walls = res.durations
            over = [w - model_s for w in walls]
            entry[kind] = {
                "wall_ms": {"p50": ms(pct(walls, 0.5)), "p99": ms(pct(walls, 0.99))},
                "upstream_ms_per_rollout": ms(model_s),
                "upstream_handler_ms_per_call": ms(handler) if handler is not None else None,
                "overhead_ms": {"p50": ms(pct(over, 0.5)), "p99": ms(pct(over, 0.99))},
                "failed": res.failed,
            }
        out[variant] = entry
    print(f"\n== latency at concurrency 1 ({n} rollouts each; ms)")
    print(f"{'variant':<9} {'pipeline':<8} {'wall p50':>9} {'wall p99':>9} {'upstream':>9} "
          f"{'overhead p50':>13} {'overhead p99':>13}")  # fmt: skip
    for variant in ("proxy", "scripted"):
        for kind in ("rollgym", "bare"):
            e = out[variant][kind]
            print(
                f"{variant:<9} {kind:<8} {e['wall_ms']['p50']:>9.2f} {e['wall_ms']['p99']:>9.2f} "
                f"{e['upstream_ms_per_rollout']:>9.2f} {e['overhead_ms']['p50']:>13.2f} "
                f"{e['overhead_ms']['p99']:>13.2f}"
            )
    print("upstream = 2 x the upstream's median round trip measured directly (a rollout makes "
          "2 model calls); overhead = wall - upstream.")  # fmt: skip
    return out


def urls(pipe: harness.Pipeline, *names: str) -> list[str]:
    return [pipe.urls[n] for n in names]


# -- 3. memory -----------------------------------------------------------------------------


def run_measured(target: str, args: list[str], report: Path) -> dict[str, Any]:
    """Run a Python entry point under ``peak.py``: its peak RSS (VmHWM at exit), RSS samples
    over time, wall time and exit code."""
    cmd = [sys.executable, str(PEAK), str(report), target, *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        ps = psutil.Process(proc.pid)
        while not stop.is_set():
            with contextlib.suppress(psutil.Error):
                samples.append((time.monotonic() - t0, ps.memory_info().rss))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    output = proc.stdout.read()  # until the child closes it, at exit
    proc.wait()
    stop.set()
    sampler.join()
    proc.stdout.close()
    wall = time.monotonic() - t0
    peak = orjson.loads(report.read_bytes()) if report.exists() else {"vm_hwm_kib": -1024}
    peak_mib = peak["vm_hwm_kib"] / 1024
    by_time = []
    for frac in (0.25, 0.5, 0.75, 1.0):
        at = [rss for t, rss in samples if t <= frac * wall]
        by_time.append(round(at[-1] / 2**20, 1) if at else None)
    return {
        "exit_code": proc.returncode,
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(peak_mib, 1),
        "rss_mib_at_25_50_75_100pct_time": by_time,
        "output_tail": output.decode(errors="replace")[-600:] if proc.returncode else "",
    }


def rollgym_collect(
    config: Path, tasks: Path, out: Path, agent: str, echo: str, c: int = 256
) -> dict[str, Any]:
    """``rollgym collect`` in a subprocess, measured."""
    args = [
        "collect", str(config), "--input", str(tasks), "--output", str(out),
        "--servers", f"agent={agent}", "--servers", f"echo={echo}",
        "--concurrency", str(c), "--no-progress",
    ]  # fmt: skip
    return run_measured("rollgym.cli.main:main", args, out.with_suffix(".peak.json"))


def bare_collect(tasks: Path, out: Path, agent: str, c: int = 256) -> dict[str, Any]:
    """``bare.py collect`` in a subprocess, measured."""
    args = ["collect", "--agent", agent, "--input", str(tasks), "--output", str(out)]
    args += ["--concurrency", str(c)]
    return run_measured(str(harness.BARE), args, out.with_suffix(".peak.json"))


async def bench_memory(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    big = 20_000 if args.quick else 200_000
    config = write_config(work / "mem.yaml", "scripted", None)
    out: dict[str, Any] = {}
    small_tasks = harness.write_tasks(work / "mem-2000.jsonl", 2000)
    big_tasks = harness.write_tasks(work / f"mem-{big}.jsonl", big)

    print("\n== memory: collector peak RSS", flush=True)
    pipe = await harness.start_pipeline("rollgym", "proxy", log_dir=work / "logs")
    try:
        out["rollgym_real_2000"] = await asyncio.to_thread(
            rollgym_collect, config, small_tasks, work / "mem-real", *urls(pipe, "agent", "echo")
        )
    finally:
        await pipe.stop()
    bare_pipe = await harness.start_pipeline("bare", "proxy")
    try:
        out["bare_real_2000"] = await asyncio.to_thread(
            bare_collect, small_tasks, work / "mem-bare-real.jsonl", bare_pipe.urls["agent"]
        )
    finally:
        await bare_pipe.stop()

    instant = harness.start_bare("instant_agent")
    try:
        for n, tasks in ((2000, small_tasks), (big, big_tasks)):
            out[f"rollgym_instant_{n}"] = await asyncio.to_thread(
                rollgym_collect, config, tasks, work / f"mem-{n}", instant.url, instant.url
            )
            out[f"bare_instant_{n}"] = await asyncio.to_thread(
                bare_collect, tasks, work / f"mem-bare-{n}.jsonl", instant.url
            )
            print(f"  done {n} rollouts against the instant agent", flush=True)
    finally:
        harness.stop_bare([instant])

    print(
        f"{'run':<24} {'peak RSS MiB':>12} {'wall s':>8} {'exit':>5}  RSS MiB at 25/50/75/100% time"
    )
    for name, r in out.items():
        print(
            f"{name:<24} {r['peak_rss_mib']:>12.1f} {r['wall_s']:>8.1f} {r['exit_code']:>5}  "
            f"{r['rss_mib_at_25_50_75_100pct_time']}"
        )
        if r["output_tail"]:
            print("    " + r["output_tail"].replace("\n", "\n    "))
    print("rollgym_*: `rollgym collect` (the CLI, progress bar off); bare_*: bare.py collect.")
    return out


# -- 4. start-up ---------------------------------------------------------------------------


def time_run(config: Path, tasks: Path, work: Path, i: int) -> dict[str, float]:
    events = work / f"events-{i}.txt"
    env = {**os.environ, "ROLLGYM_BENCH_EVENTS": str(events)}
    out_dir = work / f"run-{i}"
    t_wall = time.time()
    t0 = time.monotonic()
    cmd = [ROLLGYM, "run", str(config), "--input", str(tasks), "--output", str(out_dir)]
    proc = subprocess.run(
        [*cmd, "--no-progress"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
    )
    total = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"rollgym run exited {proc.returncode}: {proc.stderr[-500:]!r}")
    first = None
    for line in events.read_text().splitlines():
        server, path, when = line.split()
        if server == "agent" and path == "/run":
            first = float(when) - t_wall
    run_json = orjson.loads((out_dir / "run.json").read_bytes())
    return {
        "run_to_first_dispatch_s": round(first, 3) if first is not None else float("nan"),
        "supervisor_start_s": run_json.get("startup_seconds", float("nan")),
        "run_total_s": round(total, 3),
    }


def time_bare_start() -> float:
    t0 = time.monotonic()
    procs = []
    try:
        res = harness.start_bare("resources")
        procs.append(res)
        up = harness.start_bare("upstream")
        procs.append(up)
        model = harness.start_bare("proxy", upstream=up.url)
        procs.append(model)
        procs.append(harness.start_bare("agent", model=model.url, resources=res.url))
        return time.monotonic() - t0
    finally:
        harness.stop_bare(procs)


async def bench_startup(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    repeats = 2 if args.quick else 5
    print("\n== start-up", flush=True)
    config = write_config(work / "start.yaml", "scripted", None)
    counting = write_config(work / "start-counting.yaml", "scripted", None, counting=True)
    tasks = harness.write_tasks(work / "start.jsonl", 50)
    serve = [
        {
            "serve_to_healthy_s": round(
                await asyncio.to_thread(targets.time_serve, config, work, i), 3
            )
        }
        for i in range(repeats)
    ]
    runs = [await asyncio.to_thread(time_run, counting, tasks, work, i) for i in range(repeats)]
    bare = [await asyncio.to_thread(time_bare_start) for _ in range(repeats)]
    helps = [await asyncio.to_thread(targets.time_cmd, [ROLLGYM, "--help"]) for _ in range(repeats)]
    imports = [
        await asyncio.to_thread(
            targets.time_cmd,
            [sys.executable, "-c", "import rollgym.cli.worker, rollgym.agents.tool_agent"],
        )
        for _ in range(repeats)
    ]

    def med(rows: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    out = {
        "repeats": repeats,
        "serve_to_healthy_s": med(serve, "serve_to_healthy_s"),
        "run_to_first_dispatch_s": med(runs, "run_to_first_dispatch_s"),
        "run_supervisor_start_s": med(runs, "supervisor_start_s"),
        "run_total_50_rollouts_s": med(runs, "run_total_s"),
        "bare_servers_ready_s": round(statistics.median(bare), 3),
        "rollgym_help_s": round(statistics.median(helps), 3),
        "import_worker_and_agent_s": round(statistics.median(imports), 3),
        "all": {"serve": serve, "run": runs, "bare": bare, "help": helps, "imports": imports},
    }
    for key, value in out.items():
        if key not in ("all", "repeats"):
            print(f"  {key:<28} {value:.3f} s (median of {repeats})")
    print("  serve: 3 servers (scripted model, echo, agent); run: the same config with counting "
          "servers, 50 rollouts; bare: 4 bare processes started one after another to READY.")  # fmt: skip
    return out


# -- 5. concurrency ceiling ----------------------------------------------------------------


async def bench_ceiling(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    nofile = harness.raise_fd_limit()
    levels = (256, 1024, 4096)
    out: dict[str, Any] = {"rlimit_nofile": nofile, "variant": "proxy", "levels": {}}
    print(f"\n== concurrency ceiling (proxy pipeline; RLIMIT_NOFILE raised to {nofile})")
    for kind in ("rollgym", "bare"):
        pipe = await harness.start_pipeline(kind, "proxy", log_dir=work / "logs")
        try:
            for c in levels:
                n = max(2000, c) if args.quick else max(2000, 2 * c)
                tasks = harness.write_tasks(work / f"ceil-{c}.jsonl", n)
                result, cpu = await harness.measured_collect(
                    pipe, tasks, work / f"ceil-{kind}-{c}", c
                )
                framework = sum(v for k, v in cpu.items() if k != "upstream")
                row = {
                    "rollouts": n,
                    "rollouts_per_s": round(result.rate, 1),
                    "failed": result.failed,
                    "framework_cpu_ms_per_rollout": round(1000 * framework / n, 3),
                }
                if kind == "rollgym":
                    metrics = orjson.loads(
                        (work / f"ceil-{kind}-{c}" / "metrics.json").read_bytes()
                    )
                    row["failures_by_type"] = metrics["failures"]["by_type"]
                out["levels"].setdefault(str(c), {})[kind] = row
                print(
                    f"  {kind:<8} c={c:<5} {n:>6} rollouts {row['rollouts_per_s']:>8.1f}/s "
                    f"failed {row['failed']} CPU {row['framework_cpu_ms_per_rollout']:.2f} ms/rollout",
                    flush=True,
                )
        finally:
            await pipe.stop()
    for rows in out["levels"].values():
        rows["ratio"] = round(rows["rollgym"]["rollouts_per_s"] / rows["bare"]["rollouts_per_s"], 3)
    return out


async def bench_targets(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    targs = argparse.Namespace(
        rollouts=2000, repeats=2 if args.quick else 3, quick=args.quick, only=""
    )
    results = await targets.main_async(targs)
    targets.print_verdicts(results)
    return results


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    harness.raise_fd_limit()
    only = [b.strip() for b in args.only.split(",") if b.strip()] if args.only else BENCHMARKS
    unknown = set(only) - set(BENCHMARKS)
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpus": os.cpu_count(),
    }
    runners = {
        "targets": bench_targets,
        "throughput": bench_throughput,
        "latency": bench_latency,
        "memory": bench_memory,
        "startup": bench_startup,
        "ceiling": bench_ceiling,
    }
    with tempfile.TemporaryDirectory(prefix="rollgym-suite-") as tmp:
        for name in BENCHMARKS:
            if name in only:
                t0 = time.monotonic()
                out[name] = await runners[name](args, Path(tmp))
                out[name]["bench_seconds"] = round(time.monotonic() - t0, 1)
                harness.save_json("suite.json", out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated subset of {BENCHMARKS}")
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and repeats")
    args = parser.parse_args()
    # uvloop, as `rollgym run` has it: rollgym's collector runs in this process in some of the
    # benchmarks, and the bare client beside it on the same loop.
    results = runtime.run(main_async(args))
    if "targets" in results:
        targets.print_verdicts(results["targets"])
    print(f"\nwrote {harness.RESULTS_DIR / 'suite.json'}")


if __name__ == "__main__":
    main()
