"""The contract every container provider keeps, run over each of them: podman (local) and the
remote shape (``RemoteRuntime`` over real HTTP to a fake provider on 127.0.0.1 whose containers
are podman's, standing in for E2B, Modal or Daytona, which cannot run here). A new provider is
one module and one entry in ``PROVIDERS``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path

import pytest

from rollgym.containers.podman import PodmanRuntime
from rollgym.containers.remote import RemoteRuntime
from rollgym.containers.runtime import Container, Runtime, Spec
from rollgym.errors import ContainerError
from tests.containers.fake_remote import serve_fake


@contextlib.asynccontextmanager
async def podman_provider() -> AsyncIterator[Runtime]:
    yield PodmanRuntime()


@contextlib.asynccontextmanager
async def remote_provider() -> AsyncIterator[Runtime]:
    async with serve_fake(PodmanRuntime()) as url:
        runtime = RemoteRuntime(url, name="fake-remote")
        try:
            yield runtime
        finally:
            await runtime.close()


PROVIDERS: dict[str, Callable[[], AbstractAsyncContextManager[Runtime]]] = {
    "podman": podman_provider,
    "remote": remote_provider,
}


@pytest.fixture(params=sorted(PROVIDERS))
async def provider(request: pytest.FixtureRequest) -> AsyncIterator[Runtime]:
    async with PROVIDERS[request.param]() as runtime:
        yield runtime


@pytest.fixture
async def box(provider: Runtime, spec: Spec) -> AsyncIterator[Container]:
    made = await provider.create(spec, timeout=60)
    yield made
    await made.destroy()


async def test_exec_status_output_stdin_env_workdir(box: Container) -> None:
    assert isinstance(box, Container)
    done = await box.exec("echo out; echo err >&2; exit 3", timeout=30)
    assert (done.exit_code, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert not done.timed_out and not done.truncated
    done = await box.exec(
        ["sh", "-c", 'cat; echo "$X"; pwd'], timeout=30, stdin=b"in\n", env={"X": "x y"},
        workdir="/tmp",
    )  # fmt: skip
    assert done.stdout == "in\nx y\n/tmp\n"


async def test_a_deadline_kills_the_command_and_what_it_left_inside(box: Container) -> None:
    started = time.monotonic()
    done = await box.exec("setsid sleep 311 >/dev/null 2>&1 & sleep 312", timeout=1.5)
    assert done.timed_out and done.exit_code is None
    assert time.monotonic() - started < 60  # bounded, not a speed figure
    ps = await box.exec("ps -eo args", timeout=30)
    assert "sleep 311" not in ps.stdout and "sleep 312" not in ps.stdout, ps.stdout


async def test_output_is_bounded_and_says_so(box: Container) -> None:
    done = await box.exec("head -c 3000000 /dev/zero | tr '\\0' a", timeout=60, max_output=500)
    assert done.exit_code == 0 and done.truncated and done.stdout == "a" * 500


async def test_no_network_by_default(box: Container) -> None:
    done = await box.exec("cat /proc/net/dev", timeout=30)
    assert {line.split(":")[0].strip() for line in done.stdout.splitlines()[2:]} == {"lo"}


async def test_copy_in_and_out(box: Container, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello")
    await box.put(tmp_path / "in", "/work", timeout=30)
    done = await box.exec("cat /work/a.txt && mkdir /out && echo bye > /out/b.txt", timeout=30)
    assert done.stdout == "hello"
    await box.get("/out", tmp_path / "got", timeout=30)
    assert (tmp_path / "got" / "b.txt").read_text() == "bye\n"
    with pytest.raises(ContainerError):
        await box.get("/no/such/file", tmp_path / "x", timeout=30)


async def test_stop_processes_then_snapshot_starts_a_fresh_container_with_the_changes(
    provider: Runtime, box: Container, spec: Spec
) -> None:
    await box.exec("echo changed > /root/state; setsid sleep 313 >/dev/null 2>&1 &", timeout=30)
    await box.stop_processes(timeout=30)
    with pytest.raises(ContainerError):
        await box.exec("true", timeout=10)
    image = await box.snapshot(timeout=60)
    fresh = await provider.create(replace(spec, image=image), timeout=60)
    try:
        done = await fresh.exec("cat /root/state; ps -eo args", timeout=30)
        assert done.stdout.startswith("changed\n") and "sleep 313" not in done.stdout
    finally:
        await fresh.destroy()


async def test_a_removed_snapshot_is_gone_and_removing_it_again_is_no_error(
    provider: Runtime, box: Container, spec: Spec
) -> None:
    await box.stop_processes(timeout=30)
    parent = await box.snapshot(timeout=60)
    await box.destroy()
    # A snapshot of a container started from a snapshot: removing the child keeps the parent.
    child_box = await provider.create(replace(spec, image=parent), timeout=60)
    await child_box.stop_processes(timeout=30)
    image = await child_box.snapshot(timeout=60)
    await child_box.destroy()
    await provider.remove_image(image, timeout=60)
    await provider.remove_image(image, timeout=60)
    with pytest.raises(ContainerError):
        await provider.create(replace(spec, image=image), timeout=60)
    still = await provider.create(replace(spec, image=parent), timeout=60)
    await still.destroy()
    await provider.remove_image(parent, timeout=60)


async def test_destroy_twice_then_calls_fail_typed(box: Container) -> None:
    await box.destroy()
    await box.destroy()
    with pytest.raises(ContainerError):
        await box.exec("true", timeout=10)


async def test_reap_takes_orphans_and_spares_live_owners(provider: Runtime, spec: Spec) -> None:
    live = await provider.create(spec, timeout=60)
    orphan = await provider.create(
        replace(spec, lease=replace(spec.lease, owner_start="0:0")), timeout=60
    )
    image = await orphan.snapshot(timeout=60)
    removed = await provider.reap()
    assert orphan.id in removed and image in removed and live.id not in removed
    assert (await live.exec("echo alive", timeout=30)).stdout == "alive\n"
    await live.destroy()


async def test_a_lease_past_its_deadline_starts_nothing(provider: Runtime, spec: Spec) -> None:
    with pytest.raises(ContainerError, match="past its deadline"):
        await provider.create(replace(spec, lease=replace(spec.lease, deadline=1.0)), timeout=60)


async def test_a_container_past_its_disk_limit_is_ended_and_says_so(
    provider: Runtime, spec: Spec
) -> None:
    limited = replace(spec, limits=replace(spec.limits, disk_mb=32))
    made = await provider.create(limited, timeout=60)
    try:
        assert not made.disk_exceeded
        # Killed by the provider's disk limit long before its own deadline.
        done = await made.exec("fallocate -l 200M /x; echo written; sleep 100", timeout=90)
        assert done.disk_exceeded and done.exit_code is None and not done.timed_out
        assert made.disk_exceeded
        after = await made.exec("echo never", timeout=30)
        assert after.disk_exceeded and "never" not in after.stdout
    finally:
        await made.destroy()
