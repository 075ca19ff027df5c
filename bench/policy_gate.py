"""What the policy gate costs a model server at 16,384 concurrent model calls.

    .venv/bin/python bench/policy_gate.py [--calls 16384] [--median 0.005] [--p99 30]

In one process, no HTTP: ``--calls`` concurrent calls, each sleeping a delay drawn from the
scripted model's seeded long-tailed latency (``rollgym.models.latency``), run three ways:

- ``bare``: the sleeps alone (the baseline);
- ``gated``: each call through ``PolicyGate.run`` (what every rollgym model call now passes);
- ``paused``: the same, with a pause that aborts every call in flight once they all run, and a
  resume that re-issues them (a weight update in the middle of the batch).

It prints CPU microseconds per call and the traced peak memory per call of each, with the
ratios to ``bare``. Wall time is printed too but says little: it is the longest draw's.
No timed assertion anywhere; the figures are ratios within one invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from rollgym.models.latency import LatencyDist
from rollgym.server.policy import PolicyGate


async def _bare(delays: list[float]) -> None:
    await asyncio.gather(*(asyncio.sleep(d) for d in delays))


async def _gated(delays: list[float]) -> None:
    gate = PolicyGate("bench", default_replica=0)
    await asyncio.gather(*(gate.run(None, lambda d=d: asyncio.sleep(d)) for d in delays))


async def _paused(delays: list[float]) -> None:
    gate = PolicyGate("bench", default_replica=0)
    calls = asyncio.gather(*(gate.run(None, lambda d=d: asyncio.sleep(d)) for d in delays))
    while gate.in_flight < len(delays):  # noqa: ASYNC110 (the gate's own count, polled)
        await asyncio.sleep(0)
    answer = await gate.pause(abort=True, timeout_s=60)
    assert answer["aborted"] == len(delays), answer
    gate.resume(1, None, set_staleness=False)
    ran = await calls
    assert all(r.aborted_versions == (0,) and r.version == 1 for r in ran)


def _measure(run: Callable[[list[float]], Awaitable[None]], delays: list[float]) -> dict[str, Any]:
    cpu, wall = time.process_time(), time.monotonic()
    asyncio.run(run(delays))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    tracemalloc.start()
    asyncio.run(run(delays))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"cpu_us": cpu / len(delays) * 1e6, "peak_b": peak / len(delays), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=16384)
    parser.add_argument("--median", type=float, default=0.005, help="median delay, seconds")
    parser.add_argument("--p99", type=float, default=30.0, help="p99 / median")
    args = parser.parse_args()
    dist = LatencyDist.model_validate(
        {"lognormal": {"median_s": args.median, "p99_over_median": args.p99}, "seed": 0}
    )
    draw_start = time.process_time()
    delays = [dist.draw(f"{i}:0", 0) for i in range(args.calls)]
    draw_us = (time.process_time() - draw_start) / args.calls * 1e6
    print(f"{args.calls} concurrent calls; latency median {args.median}s, p99 {args.p99}x; "
          f"one draw: {draw_us:.1f} CPU us")  # fmt: skip
    base = _measure(_bare, delays)
    print(
        f"{'':8} {'CPU us/call':>12} {'x bare':>7} {'peak B/call':>12} {'x bare':>7} {'wall s':>7}"
    )
    for name, run in (("bare", _bare), ("gated", _gated), ("paused", _paused)):
        m = base if name == "bare" else _measure(run, delays)
        print(
            f"{name:8} {m['cpu_us']:12.1f} {m['cpu_us'] / base['cpu_us']:7.2f} "
            f"{m['peak_b']:12.0f} {m['peak_b'] / base['peak_b']:7.2f} {m['wall_s']:7.2f}"
        )


if __name__ == "__main__":
    main()
