"""The disk limit: ``containers.disk`` measures a layer honestly (allocated blocks, inodes,
symlinks not followed, hard links once), and on real podman a container past ``disk_mb`` is
killed and says so, one under it is never touched, and the watchdog runs only while it has
something to watch. Waits poll for a condition with a 60 s cap: no speed is asserted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from rollgym.containers.disk import ENTRY_COST, DiskWatch, measure
from rollgym.containers.podman import PodmanContainer, PodmanRuntime
from rollgym.containers.runtime import ExecResult, Spec

MB = 1024 * 1024
CAP = 60.0


async def until(condition: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    """Poll ``condition`` every 0.2 s, for at most ``CAP`` seconds."""
    deadline = time.monotonic() + CAP
    while time.monotonic() < deadline:
        got = condition()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {CAP:g} s: {what}")


# -- measuring a layer ---------------------------------------------------------------------


def test_measure_counts_allocated_blocks_not_apparent_sizes(tmp_path: Path) -> None:
    empty = measure([str(tmp_path)]).bytes
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as f:
        f.truncate(1 << 30)  # 1 GB apparent, nothing allocated
    assert measure([str(tmp_path)]).bytes - empty < MB
    full = tmp_path / "full"
    subprocess.run(["fallocate", "-l", "8M", str(full)], check=True, timeout=30)
    used = measure([str(tmp_path)])
    assert 8 * MB <= used.bytes - empty < 9 * MB  # fallocate's blocks count, unwritten or not
    assert used.complete and used.entries == 2


def test_measure_charges_inodes_follows_no_symlink_and_counts_a_hard_link_once(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    subprocess.run(["fallocate", "-l", "16M", str(outside / "big")], check=True, timeout=30)
    layer = tmp_path / "layer"
    (layer / "d").mkdir(parents=True)
    for i in range(100):
        (layer / "d" / str(i)).touch()  # no blocks, but an inode each
    (layer / "link").symlink_to(outside)
    (layer / "file-link").symlink_to(outside / "big")
    subprocess.run(["fallocate", "-l", "4M", str(layer / "a")], check=True, timeout=30)
    os.link(layer / "a", layer / "b")
    used = measure([str(layer)])
    assert used.complete and used.entries == 105
    assert used.bytes >= 4 * MB + 102 * ENTRY_COST
    assert used.bytes < 5 * MB  # neither the symlinked 16 MB nor the hard link's second name


def test_measure_stops_at_its_entry_bound_or_past_the_limit(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / str(i)).touch()
    bounded = measure([str(tmp_path)], max_entries=10)
    assert not bounded.complete and bounded.entries == 10
    early = measure([str(tmp_path)], stop_above=5 * ENTRY_COST)
    assert not early.complete and early.bytes > 5 * ENTRY_COST
    with pytest.raises(FileNotFoundError):
        measure([str(tmp_path / "gone")])
    # Only the first root (the layer) must exist; another one gone is nothing to charge.
    assert measure([str(tmp_path), str(tmp_path / "gone")]).entries == 50


def test_a_file_nested_past_path_max_stops_the_walk_and_says_why(tmp_path: Path) -> None:
    # Made through directory fds, as an agent can with relative cd's: 20 levels of 250 bytes.
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            inner = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        big = os.open("big", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.posix_fallocate(big, 0, 16 * MB)
        os.close(big)
    finally:
        os.close(fd)
    used = measure([str(tmp_path)])
    assert not used.complete and used.problem  # its 16 MB are never silently left out
    assert used.bytes < 16 * MB


async def test_a_layer_too_large_to_measure_is_judged_over(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / str(i)).touch()
    killed: list[str] = []

    async def kill() -> None:
        killed.append("x")

    watch = DiskWatch(max_entries=10)
    watched = watch.watch("k", [str(tmp_path)], 1024, kill)
    assert await watch.check_once() == [watched]
    assert watched.exceeded and "too many" in watched.reason and killed == ["x"]
    assert watch.watching == 0


async def test_a_kill_that_fails_is_tried_again_until_it_holds(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"x" * 4 * MB)
    tries: list[int] = []

    async def kill() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise OSError("podman kill timed out")

    watch = DiskWatch(interval=3600)
    watched = watch.watch("k", [str(tmp_path)], 1, kill)
    await until(lambda: len(tries) >= 1, "the first kill")
    assert watched.exceeded and watch.watching == 1  # judged; its kill failed: still held
    await watch.check_once()
    assert len(tries) == 2 and watch.watching == 0
    await until(lambda: not watch.running, "the watchdog's task ended")


# -- on real podman ------------------------------------------------------------------------


def limited(spec: Spec, disk_mb: int | None) -> Spec:
    return replace(spec, limits=replace(spec.limits, disk_mb=disk_mb))


@pytest.fixture
def fast_runtime() -> PodmanRuntime:
    return PodmanRuntime(disk_watch=DiskWatch(interval=0.5))


async def stopped(box: PodmanContainer) -> bool:
    return await box.state() != "running"


@pytest.mark.parametrize(
    "writer",
    [
        "fallocate -l 1G /x",
        "dd if=/dev/zero of=/y bs=1M count=2000 2>/dev/null",
        # /etc/hosts is a host file podman bind-mounts writable: outside the overlay layer
        "fallocate -l 1G /etc/hosts",
        # a file below a path longer than PATH_MAX: the walk cannot reach it by name
        'd=$(printf "%0250d" 0); for i in $(seq 20); do mkdir $d; cd $d; done; fallocate -l 16M x',
        # many small files: 20,000 of one byte take a block each (and an inode)
        "mkdir /many && cd /many && "
        'python3 -c "[open(str(i), chr(119)).write(chr(120)) for i in range(20000)]"',
    ],
    ids=["fallocate", "dd", "etc-hosts", "deep", "small-files"],
)
async def test_a_container_past_its_disk_limit_is_killed_and_says_so(
    fast_runtime: PodmanRuntime, spec: Spec, writer: str
) -> None:
    box = await fast_runtime.create(limited(spec, 64), timeout=60)
    try:
        assert not box.disk_exceeded
        # Started in the background: the watchdog, not the writer's end, must end it.
        await box.exec(f"nohup sh -c '{writer}; sleep 300' >/dev/null 2>&1 &", timeout=30)
        await until(lambda: box.disk_exceeded, "the container judged past its limit")
        await until(lambda: stopped(box), "the container's processes killed")
        assert box.disk is not None
        assert box.disk.used > 64 * MB or "cannot be measured" in box.disk.reason
        after = await box.exec("echo never", timeout=30)
        assert after.disk_exceeded and after.exit_code is None and "never" not in after.stdout
        assert "disk limit (64 MB) was exceeded" in after.stderr
    finally:
        await box.destroy()


async def test_an_exec_the_watchdog_ends_answers_disk_exceeded(
    fast_runtime: PodmanRuntime, spec: Spec
) -> None:
    box = await fast_runtime.create(limited(spec, 32), timeout=60)
    try:
        done = await box.exec(
            "echo started; dd if=/dev/zero of=/y bs=1M count=100000 2>/dev/null; sleep 300",
            timeout=CAP,
        )
        assert done.disk_exceeded and not done.timed_out and done.exit_code is None
        assert done.stdout == "started\n"
    finally:
        await box.destroy()


async def test_without_a_limit_the_same_write_is_fine_and_nothing_is_watched(
    runtime: PodmanRuntime, spec: Spec
) -> None:
    box = await runtime.create(limited(spec, None), timeout=60)
    try:
        done = await box.exec(
            "dd if=/dev/zero of=/y bs=1M count=100 2>/dev/null; echo ok", timeout=60
        )
        assert done.stdout == "ok\n" and not done.disk_exceeded
        assert box.disk is None and not box.disk_exceeded
        assert runtime.disk.watching == 0 and not runtime.disk.running
    finally:
        await box.destroy()


async def test_under_its_limit_a_container_is_never_touched_and_the_watchdog_stops_after(
    fast_runtime: PodmanRuntime, spec: Spec
) -> None:
    watch = fast_runtime.disk
    box = await fast_runtime.create(limited(spec, 64), timeout=60)
    try:
        assert watch.running and watch.watching == 1
        done = await box.exec(
            "dd if=/dev/zero of=/y bs=1M count=16 2>/dev/null; echo ok", timeout=60
        )
        assert done.stdout == "ok\n"
        assert box.disk is not None
        walks = box.disk.walks
        await until(lambda: box.disk is not None and box.disk.walks >= walks + 3, "three walks")
        assert 16 * MB <= box.disk.used < 64 * MB
        assert not box.disk_exceeded and await box.state() == "running"
        assert (await box.exec("echo alive", timeout=30)).stdout == "alive\n"
    finally:
        await box.destroy()
    assert watch.watching == 0
    await until(lambda: not watch.running, "the watchdog's task ended")


async def test_two_containers_with_different_limits_are_judged_apart(
    fast_runtime: PodmanRuntime, spec: Spec
) -> None:
    small = await fast_runtime.create(limited(spec, 32), timeout=60)
    large = await fast_runtime.create(limited(spec, 256), timeout=60)
    try:
        assert fast_runtime.disk.watching == 2
        for box in (small, large):
            done = await box.exec("fallocate -l 100M /x && echo ok", timeout=60)
            assert done.stdout == "ok\n" or done.disk_exceeded
        await until(lambda: small.disk_exceeded, "the 32 MB container judged over")
        assert large.disk is not None
        walks = large.disk.walks
        await until(lambda: large.disk is not None and large.disk.walks >= walks + 2, "walks")
        assert not large.disk_exceeded and await large.state() == "running"
        assert fast_runtime.disk.watching == 1
    finally:
        await small.destroy()
        await large.destroy()


async def test_a_write_just_before_the_agent_phase_ends_is_judged_at_stop(
    spec: Spec,
) -> None:
    # A watchdog that never passes on its own: only stop_processes' last look can judge.
    runtime = PodmanRuntime(disk_watch=DiskWatch(interval=3600))
    box = await runtime.create(limited(spec, 32), timeout=60)
    try:
        assert box.disk is not None
        await until(lambda: box.disk is not None and box.disk.walks == 1, "the first pass")
        assert not box.disk_exceeded
        await box.exec("fallocate -l 100M /x", timeout=60)
        await box.stop_processes(timeout=60)
        assert box.disk_exceeded and runtime.disk.watching == 0
        result = await box.exec("true", timeout=30)
        assert isinstance(result, ExecResult) and result.disk_exceeded
    finally:
        await box.destroy()
