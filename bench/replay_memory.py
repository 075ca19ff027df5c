"""Replay's memory against the run's size: runs of 1,000 and 10,000 rollouts recorded, each
replayed in a process of its own, and the peak RSS of the replay process and of the replay model
(the model stand-in serving the recorded outputs, a server process of its own) printed per size.

    .venv/bin/python bench/replay_memory.py [--sizes 1000,10000] [--pad 2000] [--concurrency 32]

Each run is the lookup environment with the scripted model answering at once (latency 0): the
example tasks cycled to SIZE rows, one rollout each, every answer padded with ``--pad`` bytes of
text (so a rollout's model output is a few KB, as a real model's is, and a replay that held the
whole plan would show it). The replay runs as ``rollgym replay`` does, under ``bench/peak.py``
(its own ``VmHWM`` at exit); its server processes are polled for theirs while they run (a
high-water mark, so a poll every 50 ms misses nothing but its last 50 ms). The figure to read is
the ratio of the largest size's peak to the smallest's: near 1x when replay's memory is bounded
by its concurrency, not by the run. Figures, not assertions: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rollgym.collect import RunAgents, local_launcher, run_collection  # noqa: E402
from rollgym.collect.layout import RunDir  # noqa: E402
from rollgym.config import load_config  # noqa: E402

LOOKUP = ROOT / "src" / "rollgym" / "envs" / "lookup"
PAD = "The registry's entry is quoted in full below for the record. "


def tasks(path: Path, size: int, pad: int) -> Path:
    """``size`` rows: the lookup examples cycled, each answer padded with ``pad`` bytes."""
    rows = [orjson.loads(x) for x in (LOOKUP / "data/example.jsonl").read_bytes().splitlines()]
    filler = (PAD * (pad // len(PAD) + 1))[:pad]
    with path.open("wb") as out:
        for i in range(size):
            row = rows[i % len(rows)]
            meta = row["responses_create_params"]["metadata"]
            script = orjson.loads(meta["rollgym_script"])
            for turn in script:
                if "say" in turn:
                    says = turn["say"] if isinstance(turn["say"], list) else [turn["say"]]
                    turn["say"] = [f"{s} {filler}" for s in says]
            padded = {**meta, "rollgym_script": orjson.dumps(script).decode()}
            params = {**row["responses_create_params"], "metadata": padded}
            out.write(orjson.dumps({**row, "responses_create_params": params}) + b"\n")
    return path


async def record(out: Path, rows: Path, concurrency: int) -> None:
    cfg = load_config(LOOKUP / "config.yaml")
    cfg.servers["model"].options["latency"] = 0.0
    collect = cfg.collect.model_copy(
        update={"repeats": 1, "limit": None, "concurrency": concurrency}
    )
    agents = RunAgents.of(cfg, collect)
    launcher = local_launcher(cfg, agents, log_dir=RunDir(out).logs)
    await run_collection(cfg, collect, rows, out, launcher, agents=agents, progress=False)


def _hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _server_name(pid: int) -> str | None:
    """The server a child process runs: its stdout is its log, ``logs/<name>.<replica>.log``."""
    with contextlib.suppress(OSError):
        log = Path(os.readlink(f"/proc/{pid}/fd/1")).name
        if log.endswith(".log"):
            return log.split(".")[0]
    return None


def _children(pid: int) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                yield int(entry.name)


def replay(src: Path, dst: Path, concurrency: int) -> tuple[dict[str, int], float, int]:
    """``rollgym replay src`` in a process of its own; the peak RSS (KiB) of it (``replay``)
    and of each of its servers, its seconds and exit code."""
    report = dst.parent / f"{dst.name}.peak.json"
    cmd = [sys.executable, str(ROOT / "bench" / "peak.py"), str(report), "rollgym.cli.main:main",
           "replay", str(src), "--output", str(dst), "--no-progress",
           "--concurrency", str(concurrency)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    peaks: dict[str, int] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = threading.Event()

    def poll() -> None:
        names: dict[int, str] = {}
        while not done.wait(0.05):
            for child in _children(proc.pid):
                name = names.get(child) or _server_name(child)
                if name is None:
                    continue
                names[child] = name
                peaks[name] = max(peaks.get(name, 0), _hwm_kib(child))

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        _, err = proc.communicate(timeout=1800)
    finally:
        done.set()
        watcher.join()
    seconds = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"replay failed ({proc.returncode}): {err.decode()[-2000:]}")
    peaks["replay"] = int(orjson.loads(report.read_bytes())["vm_hwm_kib"])
    return peaks, seconds, proc.returncode


def _summary(path: Path) -> dict[str, object]:
    """replay.json's counts (read whole: the bench's reports are small enough)."""
    data = orjson.loads(path.read_bytes())
    return {k: data[k] for k in ("replayed", "identical", "diverged")}


def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    figures: dict[int, dict[str, int]] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(args.keep) if args.keep else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="rollgym-bench-replaymem-"))
        )  # fmt: skip
        tmp.mkdir(parents=True, exist_ok=True)
        print(f"{'rollouts':>8} {'record s':>8} {'plan MB':>8} {'replay s':>8} {'exit':>4} "
              f"{'identical':>9} {'replay MiB':>10} {'model MiB':>9} {'env MiB':>8}")  # fmt: skip
        for size in sizes:
            src, dst = tmp / f"run{size}", tmp / f"replay{size}"
            t0 = time.monotonic()
            asyncio.run(record(src, tasks(tmp / f"tasks{size}.jsonl", size, args.pad),
                               args.concurrency))  # fmt: skip
            recorded = time.monotonic() - t0
            peaks, seconds, code = replay(src, dst, args.concurrency)
            figures[size] = peaks
            counts = _summary(dst / "replay.json")
            plan_mb = (dst / "replay_plan.jsonl").stat().st_size / 1e6
            print(f"{size:>8} {recorded:>8.1f} {plan_mb:>8.1f} {seconds:>8.1f} {code:>4} "
                  f"{counts['identical']!s:>9} {peaks['replay'] / 1024:>10.1f} "
                  f"{peaks.get('model', 0) / 1024:>9.1f} {peaks.get('lookup', 0) / 1024:>8.1f}")  # fmt: skip
    small, large = figures[sizes[0]], figures[sizes[-1]]
    for name, label in (("replay", "replay process"), ("model", "replay model")):
        if small.get(name) and large.get(name):
            print(f"{label}: peak RSS at {sizes[-1]} rollouts / at {sizes[0]}: "
                  f"{large[name] / small[name]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated rollout counts")
    parser.add_argument("--pad", type=int, default=2000, help="bytes added to every answer")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--keep", help="a directory to leave the runs in (default: removed)")
    main(parser.parse_args())
