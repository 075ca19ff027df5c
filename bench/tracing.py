"""What traces cost: the same collection with tracing off, on with an exporter that drops the
spans, and on with the OTLP/HTTP batch exporter to a local receiver; and "off" against the code
before tracing existed.

Each measurement is a worker process (``--worker MODE``) that starts the pipeline of
``harness.start_rollgym`` (collector in the worker, agent, model and echo env as processes of
their own), warms it up, collects ``--rollouts`` rollouts and reports rollouts/s and the CPU
seconds every process spent (collector included). Modes, alternated round by round:

- ``before``: the code of ``--base`` (default: where this branch left main), from a
  ``git archive`` put first on ``PYTHONPATH`` for the worker and every server: no hooks at all;
- ``off``: this code, no ``OTEL_TRACES_EXPORTER`` (nothing of OpenTelemetry is imported:
  the worker checks and says so);
- ``null``: tracing on in every process, spans recorded and batched by the SDK, exported to an
  exporter that drops them (an entry point ``bench_null`` of a small distribution this script
  writes to a temporary directory, named by the standard variable like any exporter);
- ``sampled``: as ``null``, with the standard sampler variables keeping 1 rollout in 100
  (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.01``): what
  a long run pays for traces of a sample of its rollouts;
- ``otlp``: tracing on, ``BatchSpanProcessor`` + OTLP/HTTP protobuf to a receiver process on
  127.0.0.1 that decodes every request (its CPU is not counted: it stands for a collector).

Figures are medians over the rounds, printed as ratios against ``off`` measured in the same
invocation; ``before`` against ``off`` shows what the hooks cost when tracing is off. A last
section times the off-path hook itself (a ``tracing.active is None`` test) and multiplies it
by the hooks a rollout passes. No assertion on any figure.

    .venv/bin/python bench/tracing.py                 # ~4 min: 3 rounds of 4 modes, 2,000 rollouts
    .venv/bin/python bench/tracing.py --rounds 1 --rollouts 500   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
MODES = ("before", "off", "null", "sampled", "otlp")
SPANS_PER_ROLLOUT = 19
"""A traced rollout of the scripted echo pipeline: the collector's 3 (rollout, call, attempt),
the agent's 11 (its /run, and a call and an attempt for each of its 5 calls), the model's 2 and
the echo env's 3 server spans."""

NULL_MODULE = '''
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class NullExporter(SpanExporter):
    """Takes every batch and drops it: the SDK's cost without serialization or network."""

    def export(self, spans):
        return SpanExportResult.SUCCESS
'''

RECEIVER = """
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
count = [0]
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        req = ExportTraceServiceRequest(); req.ParseFromString(body)
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        with lock: count[0] += n
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
    def do_GET(self):
        with lock: out = str(count[0]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out)))
        self.end_headers(); self.wfile.write(out)
    def log_message(self, *a): pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


# -- the worker: one pipeline, one measured collection -------------------------------------------


async def work(mode: str, rollouts: int, concurrency: int, out: Path) -> dict[str, Any]:
    sys.path.insert(0, str(BENCH_DIR))
    import harness

    traced = False
    if mode in ("null", "sampled", "otlp"):
        from rollgym import tracing

        traced = tracing.setup("rollgym-collector")
    pipe = await harness.start_rollgym("scripted", concurrency=concurrency, log_dir=out / "logs")
    try:
        tasks = harness.write_tasks(out / "tasks.jsonl", rollouts)
        warm = harness.write_tasks(out / "warm.jsonl", min(300, rollouts))
        await harness.collect(pipe, warm, out / "warm", concurrency)
        result, cpu = await harness.measured_collect(pipe, tasks, out / "run", concurrency)
    finally:
        await pipe.stop()
    loaded = sorted({m.split(".")[0] for m in sys.modules if m.startswith("opentelemetry")})
    return {
        "mode": mode,
        "traced": traced,
        "opentelemetry_imported": bool(loaded),
        "rollouts": result.rollouts,
        "failed": result.failed,
        "rate": result.rate,
        "cpu_ms": {k: 1000 * v / result.rollouts for k, v in cpu.items()},
    }


# -- the driver ------------------------------------------------------------------------------------


def base_tree(base: str, into: Path) -> Path:
    """``base``'s ``src`` (from ``git archive``), compiled, under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", base, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into / "src")], check=True)
    return into / "src"


def null_exporter_dist(into: Path) -> Path:
    """A distribution (a ``.dist-info`` beside a module) whose entry point ``bench_null`` in
    the SDK's exporter group names ``NullExporter``: found on ``PYTHONPATH`` like any
    installed exporter."""
    (into / "rollgym_bench_null.py").write_text(NULL_MODULE)
    info = into / "rollgym_bench_null-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rollgym-bench-null\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[opentelemetry_traces_exporter]\nbench_null = rollgym_bench_null:NullExporter\n"
    )
    return into


def mode_env(mode: str, paths: dict[str, Path], receiver: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("PYTHONPATH", None)
    if mode == "before":
        env["PYTHONPATH"] = str(paths["before"])
    elif mode in ("null", "sampled"):
        env |= {"OTEL_TRACES_EXPORTER": "bench_null", "PYTHONPATH": str(paths["null"])}
        if mode == "sampled":
            env |= {
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.01",
            }
    elif mode == "otlp":
        env |= {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver,
        }
    return env


def run_worker(mode: str, args: argparse.Namespace, env: dict[str, str], out: Path) -> Any:
    done = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--rollouts", str(args.rollouts),
         "--concurrency", str(args.concurrency), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"worker {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def received(receiver: str) -> int:
    import urllib.request

    with urllib.request.urlopen(receiver, timeout=10) as answer:
        return int(answer.read())


def hook_cost(calls: int, attempts: int, requests: int) -> dict[str, float]:
    """The off path's own cost: the hooks' ``is None`` tests a rollout passes, timed."""
    from rollgym import tracing

    assert tracing.active is None
    n = 2_000_000
    check = timeit.timeit(
        "span = None if tracing.active is None else 1", globals=locals(), number=n
    )
    empty = timeit.timeit("span = None", number=n)
    per_check_ns = max(0.0, (check - empty) / n * 1e9)
    # Per call: the call's hook; per attempt: 5 (start, headers, answered/failed/cancelled,
    # the wait); per served request: 2 (start, end); per rollout: 1.
    checks = 1 + calls + 5 * attempts + 2 * requests
    return {
        "ns_per_check": per_check_ns,
        "checks_per_rollout": checks,
        "us_per_rollout": per_check_ns * checks / 1000,
    }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default=None, help="commit of 'before' (default: merge-base)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = asyncio.run(work(args.worker, args.rollouts, args.concurrency, args.out))
        print(json.dumps(result))
        return
    modes = [m for m in args.modes.split(",") if m]
    base = args.base or subprocess.run(
        ["git", "-C", str(REPO), "merge-base", "HEAD", "main"], capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rollgym-bench-tracing-") as tmp:
        root = Path(tmp)
        paths: dict[str, Path] = {}
        if "before" in modes:
            (root / "before").mkdir()
            paths["before"] = base_tree(base, root / "before")
        if "null" in modes or "sampled" in modes:
            (root / "null").mkdir()
            paths["null"] = null_exporter_dist(root / "null")
        receiver_proc = subprocess.Popen(
            [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        try:
            assert receiver_proc.stdout is not None
            receiver = f"http://127.0.0.1:{receiver_proc.stdout.readline().strip()}"
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            spans_per_rollout: list[float] = []
            print(
                f"bench/tracing.py: {args.rounds} round(s) of {', '.join(modes)}; "
                f"{args.rollouts} rollouts at concurrency {args.concurrency}; before = {base[:10]}"
            )
            for r in range(args.rounds):
                for mode in modes:
                    seen = received(receiver)
                    started = time.monotonic()
                    out = root / f"run-{r}-{mode}"
                    result = run_worker(mode, args, mode_env(mode, paths, receiver), out)
                    if mode == "otlp":
                        # The spans of the warm-up and the measured run, all exported by exit.
                        total = args.rollouts + min(300, args.rollouts)
                        spans_per_rollout.append((received(receiver) - seen) / total)
                    runs[mode].append(result)
                    print(
                        f"  round {r + 1} {mode:>6}: {result['rate']:7.1f} rollouts/s, "
                        f"{sum(result['cpu_ms'].values()):6.3f} CPU ms/rollout, "
                        f"opentelemetry imported: {result['opentelemetry_imported']}, "
                        f"failed {result['failed']} ({time.monotonic() - started:.0f} s)"
                    )
        finally:
            receiver_proc.terminate()
            receiver_proc.wait(10)
    report(runs, spans_per_rollout)


def report(runs: dict[str, list[dict[str, Any]]], spans_per_rollout: list[float]) -> None:
    rates = {m: median([r["rate"] for r in rs]) for m, rs in runs.items()}
    cpus = {m: median([sum(r["cpu_ms"].values()) for r in rs]) for m, rs in runs.items()}
    procs = sorted(next(iter(runs.values()))[0]["cpu_ms"])
    per_proc = {
        m: {p: median([r["cpu_ms"][p] for r in rs]) for p in procs} for m, rs in runs.items()
    }
    print("\nmedians (ratios against 'off', measured in this invocation)")
    header = f"{'mode':>7} {'rollouts/s':>11} {'ratio':>6} {'CPU ms/rollout':>15} {'ratio':>6}  "
    print(header + "  ".join(f"{p:>9}" for p in procs))
    for m in runs:
        rate_ratio = rates[m] / rates["off"] if "off" in rates else float("nan")
        cpu_ratio = cpus[m] / cpus["off"] if "off" in cpus else float("nan")
        cells = "  ".join(f"{per_proc[m][p]:9.3f}" for p in procs)
        print(
            f"{m:>7} {rates[m]:11.1f} {rate_ratio:6.3f} {cpus[m]:15.3f} {cpu_ratio:6.3f}  {cells}"
        )
    if "before" in runs and "off" in runs:
        spread = [sum(r["cpu_ms"].values()) for r in runs["before"] + runs["off"]]
        print(
            f"\n'off' against 'before' (no hooks): CPU {cpus['off'] / cpus['before']:.3f}x, "
            f"rate {rates['off'] / rates['before']:.3f}x; CPU ms/rollout over all those runs: "
            f"{min(spread):.3f} .. {max(spread):.3f} (the machine's noise)"
        )
    if spans_per_rollout:
        got = median(spans_per_rollout)
        dropped = (
            " (fewer: a batch processor's queue, OTEL_BSP_MAX_QUEUE_SIZE, overflowed and "
            "dropped some)"
            if got < SPANS_PER_ROLLOUT - 0.05
            else ""
        )
        print(
            f"spans received per rollout (otlp): {got:.1f} of the {SPANS_PER_ROLLOUT} made"
            + dropped
        )
    # A rollout of the scripted echo pipeline: 6 calls (the collector's /run; the agent's
    # /seed_session, 2 model calls, /echo, /verify), one attempt each, 6 requests served.
    cost = hook_cost(calls=6, attempts=6, requests=6)
    print(
        f"off-path hooks: {cost['checks_per_rollout']} 'is None' tests per rollout x "
        f"{cost['ns_per_check']:.1f} ns = {cost['us_per_rollout']:.2f} us per rollout "
        f"({100 * cost['us_per_rollout'] / (1000 * cpus.get('off', float('nan'))):.4f}% of "
        "the off run's CPU per rollout)"
    )


if __name__ == "__main__":
    main()
