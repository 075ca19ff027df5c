"""SIGKILL the collector of a Harbor run at random points and see what the next run leaves of it.

Shared by ``test_kill.py`` (3 kills) and ``bench/harbor_kills.py`` (20). Each cycle starts
``rollgym run TASKS --agent oracle`` on slow copies of a bundled task (their ``solve.sh`` sleeps
first, so containers are alive when the kill lands), waits until a container of the run exists,
waits a seeded random while longer, SIGKILLs the collector (the process started here, by its
pid), starts the next run, and polls until nothing leased to the killed run's processes is left
(containers, storage-only containers, images). What belongs to a run is told by its lease's
owner pid (or the owner token in a name): the collector and every process below it, recorded
while it ran. Nothing here removes anything but what those runs made.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollgym.containers import lease as leases

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "harbor-tasks"
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
REPO = Path(__file__).resolve().parents[2]
SLOW_SOLVE = (
    "#!/bin/bash\nset -euo pipefail\nsleep 30\nprintf 'Hello, rollgym!\\n' > /app/hello.txt\n"
)
FIRST_CONTAINER = 180.0
"""Seconds a run may take to its first container (the first run builds the task's image)."""
CLEAN_WAIT = 30.0
"""Seconds the next run is given to clean up before a cycle counts what is left."""


def slow_tasks(dest: Path, count: int = 3) -> Path:
    """``count`` copies of the bundled ``hello-file`` whose solve.sh sleeps 30 s first."""
    for i in range(count):
        task = dest / f"slow-{i}"
        shutil.copytree(BUNDLED / "hello-file", task)
        (task / "solution" / "solve.sh").write_text(SLOW_SOLVE)
    return dest


def descendants(root: int) -> set[int]:
    """``root`` and every live process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _podman_json(*args: str) -> list[dict[str, object]]:
    # A listing fails now and then while another process removes what it lists (an image
    # gone between podman's listing and its inspecting it): ask again, a bounded number of times.
    for _ in range(10):
        done = subprocess.run(
            ["podman", *args, "--format", "json"], capture_output=True, timeout=60
        )
        if done.returncode == 0:
            return json.loads(done.stdout or b"[]") or []
        time.sleep(0.1)
    raise RuntimeError(f"podman {' '.join(args)}: {done.stderr[-500:]!r}")


@dataclass(frozen=True)
class Leftover:
    kind: str  # "container" | "storage" | "image"
    ident: str
    deadline: float | None


def leftovers(pids: set[int]) -> list[Leftover]:
    """What podman holds whose lease (or name token) names one of ``pids`` as its owner."""
    found: list[Leftover] = []
    for kind, args in (("container", ("ps", "-a")), ("image", ("images", "-a"))):
        for row in _podman_json(*args, "--filter", f"label={leases.MARK}"):
            lease = leases.from_labels(row.get("Labels") or {})  # type: ignore[arg-type]
            if lease is not None and lease.owner_pid in pids:
                found.append(Leftover(kind, str(row["Id"]), lease.deadline))
    for row in _podman_json("ps", "-a", "--external"):
        if str(row.get("State", "")).lower() != "storage":
            continue
        for name in row.get("Names") or []:  # type: ignore[attr-defined]
            match = leases._TOKEN_NAME.match(name)
            if match and int(match.group(1)) in pids:
                found.append(Leftover("storage", str(row["Id"]), None))
    return found


def start_run(tasks: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)}  # fmt: skip
    log = (out.parent / f"{out.name}.log").open("wb")
    return subprocess.Popen(
        [ROLLGYM, "run", str(tasks), "--agent", "oracle", "-o", str(out), "--no-progress"],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@dataclass
class Cycle:
    """One kill: how long after the kill's container appeared, and what the next run left."""

    killed_after: float
    left_after_clean: int
    clean_seconds: float | None  # None: not clean within CLEAN_WAIT
    past_deadline: int = 0
    owners_gone: float | None = None
    """Seconds from the kill until every process of the killed run was gone (None: some
    outlived the wait): while one lives, the reaper must keep what it owns."""


@dataclass
class KillReport:
    cycles: list[Cycle] = field(default_factory=list)

    @property
    def left(self) -> int:
        return sum(c.left_after_clean for c in self.cycles)

    @property
    def max_clean(self) -> float | None:
        times = [c.clean_seconds for c in self.cycles]
        return None if any(t is None for t in times) else max(t for t in times if t is not None)


def _wait_for_container(proc: subprocess.Popen[bytes], seen: set[int]) -> None:
    limit = time.monotonic() + FIRST_CONTAINER
    while time.monotonic() < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before any container")
        seen |= descendants(proc.pid)
        if any(x.kind == "container" for x in leftovers(seen)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"no container of the run within {FIRST_CONTAINER:g} s")


def kill_cycles(workdir: Path, kills: int, *, seed: int = 0, max_delay: float = 4.0) -> KillReport:
    """``kills`` cycles (see the module's docstring); the last run is killed too and what it
    and every other run left is removed (by id: only what these runs made)."""
    rng = random.Random(seed)
    tasks = slow_tasks(workdir / "tasks")
    report = KillReport()
    everyone: set[int] = set()
    proc = start_run(tasks, workdir / "run-0")
    try:
        for i in range(kills):
            seen: set[int] = {proc.pid}
            _wait_for_container(proc, seen)
            delay = rng.uniform(0.0, max_delay)
            limit = time.monotonic() + delay
            while time.monotonic() < limit:
                seen |= descendants(proc.pid)
                time.sleep(0.1)
            seen |= descendants(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            proc.wait(timeout=30)
            everyone |= seen
            started = time.monotonic()
            proc = start_run(tasks, workdir / f"run-{i + 1}")
            clean: float | None = None
            gone: float | None = None
            left: list[Leftover] = []
            while time.monotonic() - started < CLEAN_WAIT and (clean is None or gone is None):
                if gone is None and not any(leases.process_start(p) for p in seen):
                    gone = time.monotonic() - killed
                if clean is None:
                    left = leftovers(seen)
                    if not left:
                        clean = time.monotonic() - started
                time.sleep(0.1)
            now = time.time()
            late = sum(1 for x in left if x.deadline is not None and x.deadline < now)
            report.cycles.append(Cycle(delay, len(left), clean, late, gone))
    finally:
        everyone |= descendants(proc.pid)
        proc.kill()
        proc.wait(timeout=30)
        _remove_ours(everyone)
    return report


def _remove_ours(pids: set[int]) -> None:
    """Remove what these runs left (the test must leave nothing; only ours is touched)."""
    time.sleep(1.0)  # the killed run's podman clients die with it (PDEATHSIG): let them
    left = leftovers(pids)
    boxes = [x.ident for x in left if x.kind != "image"]
    images = [x.ident for x in left if x.kind == "image"]
    if boxes:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *boxes], capture_output=True, timeout=120)
    if images:
        subprocess.run(["podman", "rmi", "-f", *images], capture_output=True, timeout=120)
