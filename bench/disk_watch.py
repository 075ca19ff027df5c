"""What the disk watchdog (``rollgym.containers.disk``) costs, and how soon it acts.

    .venv/bin/python bench/disk_watch.py [--containers 8] [--files 5000] [--seconds 30]
                                         [--samples 5]

1. **One walk**: ``measure`` of a directory of 1,000 / 10,000 / 100,000 one-byte files (100
   subdirectories), median of 3, in ms and in microseconds per entry.
2. **Polling cost**: ``--containers`` containers with ``disk_mb=1024``, each holding ``--files``
   small files in its layer (a ``pip install``'s worth), watched at the default 1 s for
   ``--seconds``: passes, walks, ms per walk, and this process's CPU over the window (user +
   system, watchdog threads included) as a share of one core, beside the same window idle.
3. **Reaction**: ``--samples`` times, a container with ``disk_mb=64`` runs ``fallocate -l 1G``;
   seconds from the exec's start until ``disk_exceeded`` and the container stopped.

Everything is made under one run label and a lease owned by this process, removed at the end
(and by any later reaper if this process is killed). Root only (rootful podman).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollgym.containers import lease as leases
from rollgym.containers.disk import measure
from rollgym.containers.images import ensure_base
from rollgym.containers.podman import PodmanContainer, PodmanRuntime
from rollgym.containers.runtime import Limits, Spec


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def walk_figures() -> None:
    print("1. one walk (median of 3)")
    for count in (1_000, 10_000, 100_000):
        with tempfile.TemporaryDirectory() as tmp:
            for d in range(100):
                sub = Path(tmp, str(d))
                sub.mkdir()
                for i in range(count // 100):
                    (sub / str(i)).write_bytes(b"x")
            times = [measure([tmp]).seconds for _ in range(3)]
        ms = statistics.median(times) * 1000
        print(f"   {count:>7,} files: {ms:8.1f} ms  ({ms * 1000 / count:.2f} us per entry)")


async def polling_cost(spec: Spec, containers: int, files: int, seconds: float) -> None:
    print(f"2. polling cost: {containers} containers x {files:,} files, {seconds:g} s")
    start = cpu()
    await asyncio.sleep(seconds)
    idle = (cpu() - start) / seconds
    runtime = PodmanRuntime()
    boxes: list[PodmanContainer] = []
    try:
        for _ in range(containers):
            box = await runtime.create(spec, timeout=120)
            boxes.append(box)
            await box.exec(
                f"mkdir /f && cd /f && python3 -c \"[open(str(i), 'w').write('x') "
                f'for i in range({files})]"',
                timeout=120,
            )
        stats = runtime.disk.stats
        walks, walk_s, passes = stats.walks, stats.walk_seconds, stats.passes
        start = cpu()
        await asyncio.sleep(seconds)
        busy = (cpu() - start) / seconds
        walks, walk_s, passes = (
            stats.walks - walks,
            stats.walk_seconds - walk_s,
            stats.passes - passes,
        )
        assert not any(b.disk_exceeded for b in boxes)
    finally:
        await asyncio.gather(*(b.destroy() for b in boxes))
    print(f"   passes {passes}, walks {walks}, {walk_s * 1000 / max(walks, 1):.1f} ms per walk")
    print(
        f"   CPU: {busy * 100:.1f}% of a core watching, {idle * 100:.1f}% idle "
        f"({(busy - idle) * 100 / containers:.2f}% per container)"
    )


async def reaction(spec: Spec, samples: int) -> None:
    print(f"3. reaction to fallocate -l 1G at disk_mb=64 ({samples} samples)")
    runtime = PodmanRuntime()
    small = Spec(image=spec.image, limits=Limits(memory_mb=256, disk_mb=64), lease=spec.lease)
    judged, stopped = [], []
    for _ in range(samples):
        box = await runtime.create(small, timeout=120)
        try:
            began = time.monotonic()
            await box.exec(
                "nohup sh -c 'fallocate -l 1G /x; sleep 300' >/dev/null 2>&1 &", timeout=30
            )
            while not box.disk_exceeded and time.monotonic() - began < 60:  # noqa: ASYNC110 (the figure is this poll)
                await asyncio.sleep(0.05)
            judged.append(time.monotonic() - began)
            while await box.state() == "running" and time.monotonic() - began < 60:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            stopped.append(time.monotonic() - began)
        finally:
            await box.destroy()
    print(f"   judged over: median {statistics.median(judged):.2f} s, max {max(judged):.2f} s")
    print(f"   stopped:     median {statistics.median(stopped):.2f} s, max {max(stopped):.2f} s")


def remove_run(run: str) -> None:
    """Remove the containers labelled with ``run`` (this script's only)."""
    label = f"label={leases.RUN}={run}"
    ids = subprocess.run(
        ["podman", "ps", "-aq", "--filter", label], capture_output=True, text=True, timeout=60
    ).stdout.split()
    if ids:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True, timeout=120)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", type=int, default=8)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("rootful podman: run as root")
    run = f"bench-disk-{secrets.token_hex(4)}"
    spec = Spec(
        image=ensure_base(),
        limits=Limits(memory_mb=256, disk_mb=1024),
        lease=leases.new_lease(run, 3600),
    )
    walk_figures()
    try:
        await polling_cost(spec, args.containers, args.files, args.seconds)
        await reaction(spec, args.samples)
    finally:
        await asyncio.to_thread(remove_run, run)
    print(f"   (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    asyncio.run(main())
