"""Asynchronous RL against synchronous batches (issue 22), side by side in one invocation.

    .venv/bin/python bench/async_rl.py            # 8 steps of 256 rows x 16, then 16,384 in flight
    .venv/bin/python bench/async_rl.py --quick    # 3 steps of 32 rows x 8, then 2,048 in flight

**Part 1: collect and "train".** ``--steps`` training steps of ``--rows`` x ``--repeats``
rollouts against the scripted model with a long-tailed latency per model call (lognormal,
median ``--median-ms``, p99 30x the median: the scripted model's ``latency_dist``, seeded), and
a simulated training step of ``--train-s`` seconds (a sleep: the trainer holds no CPU here).
- ``sync``: ``collect`` one batch, train on it, repeat (the batch waits for its slowest rollout,
  and nothing is generated while the trainer trains);
- ``stream k``: one ``RolloutStream`` with ``max_staleness=k``; the trainer takes the first
  ``--rows`` groups to finish (a row in the long tail does not hold the step), then
  - ``k = 0`` (on-policy): pauses the model servers (aborting the calls in flight), trains,
    makes the next version live and resumes: nothing generated under the old weights is used
    after the step, so generating during it would only be thrown away;
  - ``k >= 1``: trains while the stream keeps generating (at most one step of groups waits:
    ``max_ahead``), then pauses, makes the next version live and resumes.
  Rollouts more than ``k`` versions old are cancelled in flight or discarded and re-run
  (their count is printed: work thrown away).
Reported: wall time, the trainer's idle time (wall minus the training steps), the generator's
idle time (wall minus the rollout-seconds run / the concurrency: slots left empty, through the
long tail and the training steps), stale rollouts, and the speedup of each stream over sync.

**Part 2: rollouts in flight.** One collector (a ``RolloutStream`` in a child process run by
``bench/peak.py``, which records its peak RSS) with 256 and with ``--inflight`` rollouts in
flight against a model whose calls each take ``--inflight-latency`` seconds. The model server
is paused while the collector fills up, so all of them are in flight at once (checked), then
resumed: the rate is taken from the resume to the last group; the collector's peak RSS, and
its growth per rollout in flight. The agent runs as replicas (one per 6,000 in flight: each
rollout holds two sockets in an agent, and one process may open 20,000 files here).

The servers (scripted model, echo environment, tool agent) are real processes on 127.0.0.1,
started by rollgym's ``Supervisor``. All of it shares the machine's cores with the collector,
so the rates are this machine's, not a ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness

from rollgym.config import RetryPolicy, kind_defaults, parse_config
from rollgym.http import Target
from rollgym.launch import Supervisor
from rollgym.trainer import PolicyControl, RolloutClient

PEAK = harness.BENCH_DIR / "peak.py"


def row(i: int) -> dict[str, Any]:
    text = f"echo-{i}"
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": text}],
            "tools": [harness.ECHO_TOOL],
        },
        "expected_answer": text,
    }


def config(model_options: dict[str, Any], agents: int = 1) -> Any:
    servers: dict[str, dict[str, Any]] = {
        "model": {"kind": "model", "impl": "scripted", "options": model_options},
        "echo": {"kind": "resources", "impl": "echo"},
        "agent": {
            "kind": "agent",
            "impl": "tool_agent",
            "options": {"model": "model", "resources": "echo"},
            "replicas": agents,
        },
    }
    return parse_config({"servers": servers, "collect": {"agent": "agent"}}, "<async_rl>")


@dataclass
class Mode:
    name: str
    wall: float
    train: float
    rollout_seconds: float
    concurrency: int
    rollouts: int
    stale: int = 0

    @property
    def trainer_idle(self) -> float:
        return self.wall - self.train

    @property
    def generator_idle(self) -> float:
        return self.wall - self.rollout_seconds / self.concurrency


async def run_sync(client: RolloutClient, args: argparse.Namespace) -> Mode:
    rows = [row(i) for i in range(args.rows)]
    busy = 0.0
    started = time.monotonic()
    for _ in range(args.steps):
        groups = await client.collect(
            rows, repeats=args.repeats, concurrency=args.concurrency, budget=None
        )
        busy += sum(r.duration_s for g in groups for r in g.rollouts)
        await asyncio.sleep(args.train_s)  # the training step
    wall = time.monotonic() - started
    n = args.steps * args.rows * args.repeats
    return Mode("sync batches", wall, args.steps * args.train_s, busy, args.concurrency, n)


async def run_stream(
    client: RolloutClient, model_url: str, args: argparse.Namespace, k: int, version: int
) -> tuple[Mode, int]:
    control = PolicyControl([model_url], version=version)
    rows = (row(i) for i in itertools.count())  # rows keep coming: the trainer stops the stream
    stream = client.stream(
        rows, repeats=args.repeats, concurrency=args.concurrency, max_staleness=k,
        control=control, max_ahead=args.rows, budget=None, max_stale_reruns=8,
    )  # fmt: skip
    steps, batch, busy = 0, 0, 0.0
    started = time.monotonic()
    async with stream:
        async for group in stream:
            busy += sum(r.duration_s for r in (*group.rollouts, *group.replaced))
            batch += 1
            if batch < args.rows:
                continue
            if k == 0:
                # On-policy: whatever is generated during the step would be stale after it.
                await stream.pause(abort=True, timeout_s=60)
                await asyncio.sleep(args.train_s)
            else:
                await asyncio.sleep(args.train_s)  # the stream generates on meanwhile
                await stream.pause(abort=True, timeout_s=60)  # to swap the weights
            steps, batch = steps + 1, 0
            version += 1
            await stream.resume(version)
            if steps == args.steps:
                break
        wall = time.monotonic() - started
        stats = stream.stats
    # Reset the bound for the next mode (versions never go back: the next one starts here).
    reset = PolicyControl([model_url], version=version)
    await reset.resume(version, max_staleness=None)
    await reset.aclose()
    n = args.steps * args.rows * args.repeats
    mode = Mode(f"stream, staleness {k}", wall, args.steps * args.train_s, busy,
                args.concurrency, n, stats.stale)  # fmt: skip
    return mode, version


async def part1(args: argparse.Namespace) -> list[Mode]:
    latency = {
        "latency_dist": {
            "lognormal": {"median_s": args.median_ms / 1000, "p99_over_median": 30},
            "seed": 0,
        }
    }
    supervisor = Supervisor(config(latency), log_dir=Path(tempfile.mkdtemp(prefix="async-rl-")))
    urls = await supervisor.start()
    modes: list[Mode] = []
    try:
        async with RolloutClient(urls["agent"][0], connections=args.concurrency * 2) as client:
            modes.append(await run_sync(client, args))
            print_mode(modes[-1])
            version = 0
            for k in (0, 1):
                mode, version = await run_stream(client, urls["model"][0], args, k, version)
                modes.append(mode)
                print_mode(mode)
    finally:
        await supervisor.stop()
    return modes


def print_mode(m: Mode) -> None:
    print(
        f"  {m.name:<22} wall {m.wall:7.1f} s   trainer idle {m.trainer_idle:6.1f} s "
        f"({m.trainer_idle / m.wall:4.0%})   generator idle {m.generator_idle:6.1f} s "
        f"({m.generator_idle / m.wall:4.0%})   stale re-run {m.stale}",
        flush=True,
    )


# -- part 2: rollouts in flight -----------------------------------------------------------------


async def inflight_child(args: argparse.Namespace) -> None:
    """In a child process (under peak.py): one stream of ``--total`` rollouts at concurrency
    ``--concurrency``. The model server is paused first, so every rollout dispatched waits at
    its first model call: once ``--concurrency`` are in flight at once, the model resumes
    (version ``--version``) and the rate is taken from there to the last group. Prints its
    figures as one JSON line."""
    n_rows = args.total // args.repeats
    # Thousands of connections opened within seconds overflow the agent's listen backlog
    # (4,096); the kernel's SYN retries then take longer than the default 5 s connect timeout.
    policy = RetryPolicy.model_validate({**kind_defaults("agent"), "connect_timeout": 60.0})
    agent = Target("agent", tuple(args.agent.split(",")), policy)
    control = PolicyControl([args.model], version=args.version - 1)
    await control.pause(timeout_s=600)
    async with RolloutClient(agent, connections=args.concurrency + 64) as client:
        stream = client.stream(
            (row(i) for i in range(n_rows)), repeats=args.repeats,
            concurrency=args.concurrency,
            budget=None, rollout_timeout=900,
        )  # fmt: skip
        done, failed = 0, 0
        why: Counter[str] = Counter()
        started = time.monotonic()
        async with stream:
            want = min(args.concurrency, args.total)
            while stream.in_flight < want and time.monotonic() - started < 600:  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # a bounded poll of a counter: nothing to wait on
            filled = time.monotonic() - started
            held = stream.in_flight
            released = time.monotonic()
            await control.resume(args.version)
            async for group in stream:
                done += len(group.rollouts)
                failed += len(group.failed)
                for r in group.failed:
                    root = r.error.root()
                    why[f"{root.server} {root.endpoint} {root.type} {root.status}"] += 1
            wall = time.monotonic() - released
    await control.aclose()
    figures = {
        "rate": done / wall, "wall": wall, "done": done, "failed": failed, "why": dict(why),
        "held_in_flight": held, "fill_s": filled, "peak_in_flight": stream.stats.peak_in_flight,
    }  # fmt: skip
    print(json.dumps(figures))


async def part2(args: argparse.Namespace) -> list[dict[str, Any]]:
    # Each rollout in flight holds two sockets in an agent (the collector's and its model
    # call): 16,384 in one agent process pass this machine's 20,000 open files, so the agent
    # has replicas (the collector spreads over them); the collector holds all 16,384.
    agents = max(1, -(-args.inflight // 6000))
    supervisor = Supervisor(
        config({"latency": args.inflight_latency}, agents=agents),
        log_dir=Path(tempfile.mkdtemp(prefix="async-rl-")),
    )
    urls = await supervisor.start()
    results = []
    try:
        runs = ((256, args.inflight_baseline_total), (args.inflight, args.inflight))
        for version, (concurrency, total) in enumerate(runs, start=1):
            with tempfile.TemporaryDirectory() as tmp:
                report = Path(tmp) / "peak.json"
                cmd = [
                    sys.executable, str(PEAK), str(report), __file__, "--inflight-child",
                    "--agent", ",".join(urls["agent"]), "--concurrency", str(concurrency),
                    "--total", str(total), "--repeats", "16", "--model", urls["model"][0],
                    "--version", str(version),
                ]  # fmt: skip
                out = await asyncio.to_thread(
                    subprocess.run, cmd, capture_output=True, text=True, check=True, timeout=1200
                )
                figures = json.loads(out.stdout.strip().splitlines()[-1])
                figures["peak_rss_mib"] = json.loads(report.read_text())["vm_hwm_kib"] / 1024
                figures["concurrency"] = concurrency
                results.append(figures)
                print(
                    f"  {concurrency:>6} in flight: {figures['held_in_flight']} held at once "
                    f"(filled in {figures['fill_s']:.1f} s), then {figures['rate']:5.0f} "
                    f"rollouts/s ({figures['done']} rollouts, {figures['failed']} failed, "
                    f"{figures['wall']:.1f} s); collector peak RSS "
                    f"{figures['peak_rss_mib']:.0f} MiB",
                    flush=True,
                )
                if figures["why"]:
                    print(f"    failures: {figures['why']}")
    finally:
        await supervisor.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--median-ms", type=float, default=20.0)
    parser.add_argument("--train-s", type=float, default=2.0)
    parser.add_argument("--inflight", type=int, default=16384)
    parser.add_argument("--inflight-latency", type=float, default=3.0)
    parser.add_argument("--inflight-baseline-total", type=int, default=512)
    parser.add_argument("--skip", default="", help="part1 and/or part2, comma-separated")
    # the child of part 2
    parser.add_argument("--inflight-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agent", help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--version", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    harness.raise_fd_limit()
    if args.inflight_child:
        asyncio.run(inflight_child(args))
        return
    if args.quick:
        args.steps, args.rows, args.repeats, args.train_s = 3, 32, 8, 1.0
        args.concurrency, args.inflight, args.inflight_latency = 256, 2048, 0.5
        args.inflight_baseline_total = 512
    skip = set(args.skip.split(","))
    if "part1" not in skip:
        print(
            f"Part 1: {args.steps} steps of {args.rows} rows x {args.repeats}, concurrency "
            f"{args.concurrency}, model calls lognormal (median {args.median_ms:g} ms, p99 30x), "
            f"training step {args.train_s:g} s"
        )
        modes = asyncio.run(part1(args))
        base = modes[0].wall
        for m in modes[1:]:
            print(f"  speedup of {m.name} over sync batches: x{base / m.wall:.2f}")
    if "part2" not in skip:
        print(
            f"Part 2: one collector, 256 vs {args.inflight} rollouts in flight, model calls "
            f"{args.inflight_latency:g} s each"
        )
        small, big = asyncio.run(part2(args))
        grow = (
            (big["peak_rss_mib"] - small["peak_rss_mib"])
            * 1024
            / max(1, big["peak_in_flight"] - small["peak_in_flight"])
        )
        print(
            f"  rate x{big['rate'] / small['rate']:.1f}, peak RSS "
            f"x{big['peak_rss_mib'] / small['peak_rss_mib']:.2f} "
            f"({grow:.1f} KiB per rollout in flight)"
        )


if __name__ == "__main__":
    main()
