"""Replay against the original run: 1,000 rollouts of the bundled environments recorded with the
scripted model at a fixed latency per call, then replayed with the model served from the record.

    .venv/bin/python bench/replay.py [--rollouts 1000] [--latency 1.0] [--concurrency 32]

Each bundled environment (src/rollgym/envs/*/config.yaml, its example tasks, repeats to share
the rollouts out) runs as ``rollgym run`` does, its scripted model answering every call after
``--latency`` seconds (the model's ``latency`` option: the stand-in for a real model's time); then
``rollgym replay`` runs the same agents and environments with the recorded outputs. Prints, per
environment and in all, the rollouts replayed identically and the speed ratio original/replay:
of the dispatch (``metrics.json`` timing, servers up) and of the whole command (start-up
included). Figures, not assertions: the machine is shared.

Replay saves the model's time only: the environment's own work (a scoring pool's checks, the
code environment's sandboxed programs) it must do again to check the rewards. So each
environment is also run once more with a model that answers at once (latency 0): ``floor s``
is that run's dispatch, the environment's own work plus the harness, which no replay can go
below; ``replay-floor`` is what replay spends beyond it, and ``ceiling`` (original / floor) is
the most any replay that re-runs the environment could reach on that environment at this model
latency. ``--no-floor`` leaves them out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rollgym.collect import RunAgents, local_launcher, run_collection  # noqa: E402
from rollgym.collect.layout import RunDir  # noqa: E402
from rollgym.config import load_config  # noqa: E402
from rollgym.dialects import ROW_DIALECTS, SERVER_DIALECTS  # noqa: E402
from rollgym.replay import replay  # noqa: E402

ENVS = ("lookup", "math", "mcqa", "guess", "reasoning_gym", "judge", "code")


async def original(env: str, out: Path, rollouts: int, latency: float, conc: int) -> float:
    """``rollouts`` rollouts of ``env``'s example tasks into ``out``; its dispatch seconds."""
    folder = ROOT / "src" / "rollgym" / "envs" / env
    cfg = load_config(folder / "config.yaml")
    for server in cfg.servers.values():
        if server.kind == "model" and server.impl == "scripted":
            server.options["latency"] = latency
    tasks = folder / "data" / "example.jsonl"
    n = sum(1 for line in tasks.read_bytes().splitlines() if line.strip())
    repeats = max(1, -(-rollouts // n))
    limit = min(n, -(-rollouts // repeats))  # limit x repeats: the share, or a few more
    collect = cfg.collect.model_copy(
        update={"repeats": repeats, "limit": limit, "concurrency": conc}
    )
    agents = RunAgents.of(cfg, collect)
    launcher = local_launcher(cfg, agents, log_dir=RunDir(out).logs)
    await run_collection(
        cfg, collect, tasks, out, launcher, agents=agents, progress=False,
        agent_dialects=SERVER_DIALECTS, dialects=ROW_DIALECTS,
    )  # fmt: skip
    return _dispatch_s(out)


def _dispatch_s(out: Path) -> float:
    return float(orjson.loads((out / "metrics.json").read_bytes())["timing"]["wall_seconds"])


@contextlib.contextmanager
def _workdir(keep: str | None) -> Iterator[str]:
    if keep is not None:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="rollgym-bench-replay-") as tmp:
        yield tmp


async def main(args: argparse.Namespace) -> None:
    envs = tuple(args.envs.split(",")) if args.envs else ENVS
    per_env = args.rollouts // len(envs)
    shares = [per_env + (1 if i < args.rollouts % len(envs) else 0) for i in range(len(envs))]
    totals = {"rollouts": 0, "identical": 0, "orig": 0.0, "replay": 0.0, "orig_all": 0.0,
              "replay_all": 0.0, "floor": 0.0}  # fmt: skip
    with _workdir(args.keep) as tmp:
        print(f"{'env':>14} {'replayed':>8} {'identical':>9} {'orig s':>7} {'replay s':>8} "
              f"{'ratio':>6} {'ratio(cmd)':>10} {'floor s':>7} {'replay-floor':>12} {'ceiling':>7}")  # fmt: skip
        for env, share in zip(envs, shares, strict=True):
            src, dst = Path(tmp) / env, Path(tmp) / f"{env}-replay"
            t0 = time.monotonic()
            orig = await original(env, src, share, args.latency, args.concurrency)
            orig_all = time.monotonic() - t0
            t0 = time.monotonic()
            _, report = await replay(
                src,
                dst,
                concurrency=args.concurrency,
                progress=False,
                agent_dialects=SERVER_DIALECTS,
                dialects=ROW_DIALECTS,
            )
            replay_all = time.monotonic() - t0
            for entry in report.shown[:3]:
                print(f"{'':>14} diverged: {entry.to_dict()}"[:400])
            rep = _dispatch_s(dst)
            n = report.replayed
            floor = float("nan")
            if args.floor:
                floor = await original(
                    env, Path(tmp) / f"{env}-floor", share, 0.0, args.concurrency
                )
            print(f"{env:>14} {n:>8} {report.identical:>9} {orig:>7.2f} {rep:>8.2f} "
                  f"{orig / rep:>6.1f} {orig_all / replay_all:>10.1f} {floor:>7.2f} "
                  f"{rep - floor:>12.2f} {orig / floor:>7.1f}")  # fmt: skip
            for key, value in (("rollouts", n), ("identical", report.identical), ("orig", orig),
                               ("replay", rep), ("orig_all", orig_all),
                               ("replay_all", replay_all), ("floor", floor)):  # fmt: skip
                totals[key] += value
    t = totals
    print(
        f"all: {t['identical']:.0f} of {t['rollouts']:.0f} replayed identically; replay "
        f"{t['orig'] / t['replay']:.1f}x faster than the original run (dispatch, model latency "
        f"{args.latency:g} s per call), {t['orig_all'] / t['replay_all']:.1f}x with start-up"
    )
    if args.floor:
        print(
            f"floor (the same runs with a model answering at once): {t['floor']:.2f} s; replay "
            f"{t['replay']:.2f} s, {t['replay'] - t['floor']:+.2f} s beyond it; the original's "
            f"time beyond it {t['orig'] - t['floor']:.2f} s; ceiling (original / floor) "
            f"{t['orig'] / t['floor']:.1f}x"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per model call")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--envs", help="comma-separated bundled environments (default: all)")
    parser.add_argument("--keep", help="a directory to leave the runs in (default: removed)")
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false", help="skip the latency-0 runs"
    )
    asyncio.run(main(parser.parse_args()))
