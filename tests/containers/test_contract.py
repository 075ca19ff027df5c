"""The contract every container provider keeps, run over each of them: podman (local) and the
remote shape (``RemoteRuntime`` over real HTTP to a fake provider on 127.0.0.1 whose containers
are podman's, standing in for E2B, Modal or Daytona, which cannot run here). A new provider is
one module and one entry in ``PROVIDERS``."""

from __future__ import annotations

import contextlib
import tarfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path

import pytest

from rollgym.containers.podman import PodmanRuntime
from rollgym.containers.remote import RemoteRuntime
from rollgym.containers.runtime import TOO_LARGE, Container, Mount, Runtime, Spec
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


async def test_changes_are_read_from_outside_links_deletions_opaque_dirs_and_drops(
    box: Container,
) -> None:
    # Made by the container's programs: a file, a link out of it (to a secret and up a chain
    # of ..), a deletion, a directory removed and made again, and a change under a dropped tree.
    script = (
        "mkdir -p /app/sub && echo hi > /app/sub/a && ln -s /etc/shadow /app/shadow"
        " && ln -s ../../../../../../etc/passwd /app/sub/up && rm /etc/issue"
        " && rm -rf /etc/apt && mkdir /etc/apt && echo y > /etc/apt/only"
        " && echo z > /usr/bin/planted && rm /usr/bin/tail"
    )
    assert (await box.exec(script, timeout=30)).exit_code == 0
    await box.stop_processes(timeout=30)
    found = await box.changes(timeout=60, drop=("/usr",))
    try:
        assert {"/app/sub/a", "/app/shadow", "/app/sub/up", "/etc/apt/only"} <= set(found.changed)
        assert found.deleted == ("/etc/issue",) and found.opaque == ("/etc/apt",)
        assert {"+/usr/bin/planted", "-/usr/bin/tail"} <= set(found.dropped)
        assert not any(p.startswith("/usr") for p in found.changed)
        assert not any(p.startswith(("/etc/hosts", "/etc/resolv", "/proc")) for p in found.changed)
        with tarfile.open(found.archive) as tar:
            members = {m.name: m for m in tar.getmembers()}
            # The links are links: no byte of what they point to is in the archive.
            assert members["app/shadow"].issym() and members["app/shadow"].linkname == "/etc/shadow"
            assert members["app/sub/up"].issym()
            assert tar.extractfile("app/sub/a").read() == b"hi\n"  # type: ignore[union-attr]
            assert not any(n.startswith("usr") for n in members)
    finally:
        found.discard()
    assert not found.archive.exists()


async def test_changes_past_their_bounds_are_a_typed_error(box: Container) -> None:
    await box.exec(
        "mkdir /many && cd /many && touch a b c d e f && head -c 5000 /dev/zero > g", timeout=30
    )
    await box.stop_processes(timeout=30)
    with pytest.raises(ContainerError) as raised:
        await box.changes(timeout=60, max_entries=4)
    assert raised.value.status == TOO_LARGE
    with pytest.raises(ContainerError) as raised:
        await box.changes(timeout=60, max_bytes=4000)
    assert raised.value.status == TOO_LARGE
    found = await box.changes(timeout=60, max_bytes=5000)
    found.discard()
    assert len([p for p in found.changed if p.startswith("/many")]) == 8


async def test_cpu_seconds_count_what_the_container_burnt(box: Container) -> None:
    before = await box.cpu_seconds()
    await box.exec("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done", timeout=120)
    after = await box.cpu_seconds()
    assert before is not None and after is not None and after > before


async def test_a_mount_is_seen_read_only(provider: Runtime, spec: Spec, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "f").write_text("from the host")
    made = await provider.create(
        replace(spec, mounts=(Mount(tmp_path / "m", "/.m-x"),)), timeout=60
    )
    try:
        done = await made.exec("cat /.m-x/f", timeout=30)
        assert done.stdout == "from the host"
        if isinstance(provider, PodmanRuntime):  # a remote provider copies it in
            wrote = await made.exec("echo no > /.m-x/f", timeout=30)
            assert wrote.exit_code != 0
            assert (tmp_path / "m" / "f").read_text() == "from the host"
    finally:
        await made.destroy()
