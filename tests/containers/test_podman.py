"""PodmanRuntime on real podman: deadlines that kill what runs inside, bounded output, no
network, limits, leases as labels, snapshots, and podman's failures as typed errors."""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
from dataclasses import replace

import pytest

from rollgym.containers import lease as leases
from rollgym.containers.podman import Completed, PodmanContainer, PodmanRuntime, translate
from rollgym.containers.runtime import Container, Limits, Runtime, Spec
from rollgym.errors import ContainerError, RollgymError


def inspect(ident: str) -> dict:
    out = subprocess.run(
        ["podman", "inspect", ident], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return json.loads(out)[0]


async def test_it_implements_the_seam(runtime: PodmanRuntime, container: PodmanContainer) -> None:
    assert isinstance(runtime, Runtime)
    assert isinstance(container, Container)


async def test_limits_and_lease_are_applied(container: PodmanContainer, spec: Spec) -> None:
    info = inspect(container.id)
    host = info["HostConfig"]
    assert host["Memory"] == 256 * 1024 * 1024
    assert host["PidsLimit"] == 128
    assert host["NanoCpus"] == 1_000_000_000
    assert leases.from_labels(info["Config"]["Labels"]) == spec.lease
    # The memory bound holds: a program past it is killed, not the machine.
    done = await container.exec(
        ["python3", "-c", "b = bytearray(400 * 1024 * 1024); print('survived')"], timeout=60
    )
    assert done.exit_code != 0 and "survived" not in done.stdout


async def test_the_keepalive_ends_at_the_lease_deadline(
    runtime: PodmanRuntime, spec: Spec, run_name: str
) -> None:
    short = replace(spec, lease=leases.new_lease(run_name, 2))
    box = await runtime.create(short, timeout=60)

    async def state() -> str:
        # Past its deadline, any rollgym reaper on this machine may remove it (a clean-clone
        # run beside other rollgym processes saw that): gone is as ended as exited.
        try:
            return await box.state()
        except ContainerError:
            return "gone"

    for _ in range(100):  # bounded: 20 s
        if await state() != "running":
            break
        await asyncio.sleep(0.2)
    assert await state() in ("exited", "gone")
    with pytest.raises(ContainerError, match=r"not running|is gone"):
        await box.exec("true", timeout=10)
    await box.destroy()


def test_translate_names_known_causes() -> None:
    def done(stderr: str, *, timed_out: bool = False) -> Completed:
        return Completed(None if timed_out else 125, b"", stderr.encode(), 3.0, timed_out, False)

    assert "is gone" in translate("exec", done("Error: no container with name or id x")).message
    assert "not in local storage" in translate("run", done("Error: x: image not known")).message
    late = translate("run", done("", timed_out=True))
    assert "took longer" in late.message and late.retryable
    other = translate("cp", done("Error: something odd\n"))
    assert "something odd" in other.message and other.status == 125


async def test_unknown_image_fails_typed(runtime: PodmanRuntime, spec: Spec) -> None:
    with pytest.raises(ContainerError):
        await runtime.create(replace(spec, image="localhost/rollgym-no-such:x"), timeout=60)


async def test_network_when_allowed(runtime: PodmanRuntime, spec: Spec) -> None:
    box = await runtime.create(replace(spec, limits=Limits(network=True)), timeout=60)
    try:
        done = await box.exec("cat /proc/net/dev", timeout=30)
        assert len(done.stdout.splitlines()) > 3  # an interface beside lo
    finally:
        await box.destroy()


async def test_a_command_cannot_pass_its_failure_off_as_podmans(
    container: PodmanContainer,
) -> None:
    # A failing command that prints what podman prints is still the command's result (a
    # provider failure would drop the rollout from its group instead of scoring it).
    done = await container.exec("echo 'Error: container state improper' >&2; exit 255", timeout=30)
    assert done.exit_code == 255


async def test_a_gone_container_fails_typed_and_the_error_pickles(
    container: PodmanContainer,
) -> None:
    await container.destroy()
    with pytest.raises(ContainerError) as caught:
        await container.exec("true", timeout=10)
    err = caught.value
    assert err.server == "podman" and err.endpoint == "exec"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ContainerError and again == err
    assert RollgymError.from_dict(err.to_record()) == err


async def test_a_missing_program_is_the_commands_failure(container: PodmanContainer) -> None:
    assert (await container.exec(["no-such-program"], timeout=30)).exit_code == 127
