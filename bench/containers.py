"""Container start-up, warm groups and density on this machine's podman (runc), each figure
beside a published reference.

    .venv/bin/python bench/containers.py [--samples 20] [--cold-samples 4] [--group 16]
                                         [--max 200] [--budget 120]

1. **Start, warm**: a container from a prepared image (built, set up and committed once), up
   to its first command's answer (create + ``exec true``); ``--samples`` starts, one at a time.
2. **Start, cold**: the same rollout with nothing prepared: its image built (a cache miss: a
   context of its own), its setup step run, then create + ``exec true``; ``--cold-samples``.
3. **A group of ``--group``**: cold (every member built, set up and started, 4 at a time)
   against warm, twice: the task's first group (one build, one setup, then the group started
   from the snapshot, 8 at a time) and the task seen again (the state prepared already, as at
   a GRPO run's next step: the starts only). Wall seconds and the ratios (the issue's target:
   at least 10x).
4. **Density**: containers (``sleep`` keep-alive, 64 MB memory limit) started 8 at a time until
   ``--max``, ``--budget`` seconds, less than 2 GB of memory available, or a refused start;
   the count and the memory each takes: its cgroup's usage plus its conmon's PSS, and
   MemAvailable's fall over the count (noisier: the machine is shared).

References (what the figures are compared with, not measured here): E2B's published sandbox
start p50 of 442 ms, Daytona's 663 ms, Firecracker's typical 12 ms VMM start (a bare microVM,
no guest userland or agent).

Everything is made under one run label and a lease owned by this process; it is removed at the
end, on Ctrl-C or SIGTERM, and by any later reaper if this process is killed outright. Results
are also written to ``bench/results/containers.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollgym.containers import lease as leases
from rollgym.containers.images import build_task_image, ensure_base
from rollgym.containers.podman import PodmanRuntime
from rollgym.containers.runtime import Container, Limits, Spec
from rollgym.containers.warm import prepare_state, start_group

REFERENCES_MS = {"E2B p50": 442.0, "Daytona p50": 663.0, "Firecracker VMM": 12.0}
DOCKERFILE = """FROM python:3.11-slim
COPY token /token
RUN python -m venv /venv && /venv/bin/python -c "import sys; print(sys.version)"
WORKDIR /repo
"""
SETUP = (
    "git init -q /repo && cd /repo && echo 'def f(): return 1' > m.py && git add -A && "
    "git -c user.email=b@b -c user.name=b commit -qm base && python -m compileall -q /repo"
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def accounted_mb(ids: list[str]) -> float:
    """Mean memory of these containers, each its cgroup's usage (what runs inside, page cache
    included) plus its conmon's proportional set size (the podman monitor beside it)."""
    if not ids:
        return 0.0
    out = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.ConmonPid}} {{.State.CgroupPath}}", *ids],
        capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    total = 0.0
    for line in out.splitlines():
        conmon, _, cgroup = line.partition(" ")
        for usage in (f"/sys/fs/cgroup/memory{cgroup}/memory.usage_in_bytes",
                      f"/sys/fs/cgroup{cgroup}/memory.current"):  # fmt: skip
            if Path(usage).exists():
                total += int(Path(usage).read_text()) / 2**20
                break
        smaps = Path(f"/proc/{conmon}/smaps_rollup")
        if smaps.exists():
            for row in smaps.read_text().splitlines():
                if row.startswith("Pss:"):
                    total += int(row.split()[1]) / 1024
    return total / len(ids)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.runtime = PodmanRuntime()
        self.run = f"bench-{secrets.token_hex(4)}"
        self.lease = leases.new_lease(self.run, 1800)
        self.tags: list[str] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="rollgym-bench-"))

    def spec(self, image: str, **limits: object) -> Spec:
        return Spec(image=image, limits=Limits(**limits), lease=self.lease)  # type: ignore[arg-type]

    def build_cold(self) -> str:
        """A task image built now (a context of its own: never a cache hit)."""
        context = self.tmp / secrets.token_hex(4)
        context.mkdir()
        (context / "token").write_text(secrets.token_hex(8))
        (context / "Dockerfile").write_text(DOCKERFILE)
        tag = build_task_image(context / "Dockerfile", context, timeout=600)
        self.tags.append(tag)
        return tag

    async def start_one(self, image: str) -> tuple[float, Container]:
        started = time.monotonic()
        box = await self.runtime.create(self.spec(image), timeout=120)
        done = await box.exec("true", timeout=60)
        assert done.exit_code == 0, done
        return time.monotonic() - started, box

    async def cold_rollout(self) -> tuple[float, Container]:
        started = time.monotonic()
        image = await asyncio.to_thread(self.build_cold)
        state = await prepare_state(self.runtime, self.spec(image), setup=SETUP, timeout=300)
        _, box = await self.start_one(state.image)
        return time.monotonic() - started, box

    async def starts(self) -> dict[str, object]:
        image = await asyncio.to_thread(self.build_cold)
        state = await prepare_state(self.runtime, self.spec(image), setup=SETUP, timeout=300)
        warm: list[float] = []
        for _ in range(self.args.samples):
            seconds, box = await self.start_one(state.image)
            warm.append(seconds)
            await box.destroy()
        cold: list[float] = []
        for _ in range(self.args.cold_samples):
            seconds, box = await self.cold_rollout()
            cold.append(seconds)
            await box.destroy()
        return {
            "warm_ms": {"p50": percentile(warm, 0.5) * 1e3, "p99": percentile(warm, 0.99) * 1e3,
                        "n": len(warm)},
            "cold_ms": {"p50": percentile(cold, 0.5) * 1e3, "p99": percentile(cold, 0.99) * 1e3,
                        "n": len(cold)},
        }  # fmt: skip

    async def group(self) -> dict[str, object]:
        n = self.args.group

        async def warm_members(image: str) -> None:
            members = await start_group(self.runtime, self.spec(image), n, parallel=8)
            await asyncio.gather(*(box.exec("true", timeout=60) for box in members))
            await asyncio.gather(*(box.destroy() for box in members))

        # The first group of a task: its one build and setup, then n starts from the snapshot.
        started = time.monotonic()
        image = await asyncio.to_thread(self.build_cold)
        state = await prepare_state(self.runtime, self.spec(image), setup=SETUP, timeout=300)
        await warm_members(state.image)
        warm_first = time.monotonic() - started
        # The task again (the next GRPO step): its state is prepared already.
        started = time.monotonic()
        await warm_members(state.image)
        warm_again = time.monotonic() - started

        gate = asyncio.Semaphore(4)

        async def cold_member() -> Container:
            async with gate:
                return (await self.cold_rollout())[1]

        started = time.monotonic()
        members = list(await asyncio.gather(*(cold_member() for _ in range(n))))
        cold = time.monotonic() - started
        await asyncio.gather(*(box.destroy() for box in members))
        return {
            "n": n, "warm_first_s": warm_first, "warm_again_s": warm_again, "cold_s": cold,
            "ratio_first": cold / warm_first, "ratio_again": cold / warm_again,
        }  # fmt: skip

    async def density(self, image: str) -> dict[str, object]:
        before = mem_available_mb()
        deadline = time.monotonic() + self.args.budget
        boxes: list[Container] = []
        stop = ""
        while not stop:
            batch = min(8, self.args.max - len(boxes))
            results = await asyncio.gather(
                *(self.runtime.create(self.spec(image, memory_mb=64, pids=64), timeout=120)
                  for _ in range(batch)),
                return_exceptions=True,
            )  # fmt: skip
            for result in results:
                if isinstance(result, BaseException):
                    stop = f"a start was refused: {str(result)[:120]}"
                else:
                    boxes.append(result)
            if len(boxes) >= self.args.max:
                stop = f"--max {self.args.max} reached"
            elif time.monotonic() > deadline:
                stop = f"--budget {self.args.budget:.0f} s spent"
            elif mem_available_mb() < 2048:
                stop = "less than 2 GB of memory available"
        await asyncio.sleep(2)  # let the last ones settle before reading memory
        after = mem_available_mb()
        running = len(boxes)
        accounted = await asyncio.to_thread(accounted_mb, [b.id for b in boxes])
        await asyncio.gather(*(b.destroy() for b in boxes), return_exceptions=True)
        return {
            "containers": running,
            "mb_each_memavailable": (before - after) / max(1, running),
            "mb_each_accounted": accounted,
            "stopped_because": stop,
        }

    def cleanup(self) -> None:
        """Everything this bench made, by its run label and its tags (nothing else)."""
        label = f"label={leases.RUN}={self.run}"
        for kind, remove in (("ps", ["rm", "-f", "-t", "0"]), ("images", ["rmi", "-f"])):
            listed = subprocess.run(
                ["podman", kind, "-aq", "--filter", label],
                capture_output=True, text=True, timeout=120,
            ).stdout.split()  # fmt: skip
            if listed:
                subprocess.run(["podman", *remove, *set(listed)], capture_output=True, timeout=300)
        if self.tags:
            subprocess.run(["podman", "rmi", "-f", *self.tags], capture_output=True, timeout=300)
        subprocess.run(["rm", "-rf", str(self.tmp)], timeout=60)


def report(results: dict[str, dict[str, object]]) -> None:
    refs = "  ".join(f"{k} {v:.0f} ms" for k, v in REFERENCES_MS.items())
    s = results["start"]
    warm, cold = s["warm_ms"], s["cold_ms"]  # type: ignore[index]
    print(f"\ncontainer start (create + first command), podman {PodmanRuntime().oci_runtime}:")
    print(f"  warm  p50 {warm['p50']:7.0f} ms  p99 {warm['p99']:7.0f} ms  (n={warm['n']})")
    print(f"  cold  p50 {cold['p50']:7.0f} ms  p99 {cold['p99']:7.0f} ms  (n={cold['n']}: build"
          " + setup + start; p99 of few samples is their max)")  # fmt: skip
    print(f"  warm p50 / E2B p50: {warm['p50'] / REFERENCES_MS['E2B p50']:.2f}x   "
          f"/ Daytona p50: {warm['p50'] / REFERENCES_MS['Daytona p50']:.2f}x   "
          f"/ Firecracker VMM: {warm['p50'] / REFERENCES_MS['Firecracker VMM']:.0f}x")  # fmt: skip
    print(f"  references: {refs}")
    g = results["group"]
    print(f"\ngroup of {g['n']} (cold: every member built, set up and started, 4 at a time):")
    print(f"  cold {g['cold_s']:.1f} s")
    for key, what in (
        ("first", "the task's first group (one build + setup, then the starts)"),
        ("again", "the task again (state prepared already: the starts only)"),
    ):
        ratio = g[f"ratio_{key}"]
        verdict = "met" if ratio >= 10 else "not met"  # type: ignore[operator]
        print(f"  warm {g[f'warm_{key}_s']:.1f} s, cold/warm {ratio:.1f}x (target >= 10x: "
              f"{verdict}): {what}")  # fmt: skip
    d = results["density"]
    print(
        f"\ndensity: {d['containers']} containers at once (stopped: {d['stopped_because']});"
        f" memory each: {d['mb_each_accounted']:.1f} MB (its cgroup + its conmon's PSS), "
        f"{d['mb_each_memavailable']:.1f} MB (MemAvailable's fall: the machine is shared)"
    )


async def main(args: argparse.Namespace) -> None:
    bench = Bench(args)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        base = await asyncio.to_thread(ensure_base)
        results: dict[str, dict[str, object]] = {}
        print("start-up samples ...", flush=True)
        results["start"] = await bench.starts()
        print(f"a group of {args.group}, warm then cold ...", flush=True)
        results["group"] = await bench.group()
        print("density ...", flush=True)
        results["density"] = await bench.density(base)
        results["references_ms"] = dict(REFERENCES_MS)
        report(results)
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / "containers.json").write_text(json.dumps(results, indent=2))
    except asyncio.CancelledError:
        print("interrupted: cleaning up", file=sys.stderr)
    finally:
        await asyncio.to_thread(bench.cleanup)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--cold-samples", type=int, default=4)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--max", type=int, default=200)
    parser.add_argument("--budget", type=float, default=120.0)
    if os.geteuid() != 0:
        sys.exit("bench/containers.py runs rootful podman: run it as root")
    asyncio.run(main(parser.parse_args()))
