"""Warm groups: one prepared state (setup run once, committed), n containers from it, each
with its own copy-on-write filesystem; all or none."""

from __future__ import annotations

import asyncio

import pytest

from rollgym.containers.podman import PodmanRuntime
from rollgym.containers.runtime import Spec
from rollgym.containers.warm import prepare_state, start_group, warm_group
from rollgym.errors import ContainerError
from tests.containers.conftest import run_containers


async def test_a_group_starts_from_one_prepared_state_and_each_copy_is_its_own(
    runtime: PodmanRuntime, spec: Spec
) -> None:
    setup = "echo $$ > /setup-pid; mkdir -p /repo && echo v1 > /repo/file"
    state, group = await warm_group(runtime, spec, 3, setup=setup, timeout=120)
    try:
        assert state.image != spec.image
        outs = await asyncio.gather(
            *(box.exec(f"cat /setup-pid; echo {i} > /repo/file", timeout=30)
              for i, box in enumerate(group))
        )  # fmt: skip
        # The setup ran once: every member sees the same state.
        assert len({out.stdout for out in outs}) == 1 and outs[0].exit_code == 0
        # Each member's writes are its own (copy-on-write, not a shared directory).
        reads = await asyncio.gather(*(box.exec("cat /repo/file", timeout=30) for box in group))
        assert [r.stdout for r in reads] == ["0\n", "1\n", "2\n"]
    finally:
        await asyncio.gather(*(box.destroy() for box in group))


async def test_a_failing_setup_starts_nothing(runtime: PodmanRuntime, spec: Spec) -> None:
    with pytest.raises(ContainerError, match="setup step") as caught:
        await prepare_state(runtime, spec, setup="echo broken; exit 4", timeout=60)
    assert "broken" in (caught.value.body or "")


async def test_a_group_is_all_or_none(runtime: PodmanRuntime, spec: Spec, run_name: str) -> None:
    class OneFails:
        name = "one-fails"

        def __init__(self) -> None:
            self.calls = 0

        async def create(self, spec: Spec, *, timeout: float) -> object:
            self.calls += 1
            if self.calls == 3:
                raise ContainerError("no room")
            return await runtime.create(spec, timeout=timeout)

    with pytest.raises(ContainerError, match="no room"):
        await start_group(OneFails(), spec, 4, parallel=1)  # type: ignore[arg-type]
    # The two made before the failure are gone too.
    assert run_containers(run_name) == []
