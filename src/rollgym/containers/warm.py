"""Warm groups: the n rollouts of one task (a GRPO group) start from one prepared state.

A task's state is prepared once: its image built (``images.build_task_image``, cached by
digest), then, if the task has a setup step (install its dependencies, check out its repository,
warm a cache), that step run once in a container whose filesystem is then committed as an image
(``Container.snapshot``). The group's n containers all start from that image: podman's overlay
shares its layers copy-on-write, so each container pays for what it changes and nothing else, and
nothing is built or set up n times. Cold is the same work done for every rollout.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from rollgym.containers.runtime import Container, Runtime, Spec
from rollgym.errors import ContainerError


@dataclass(frozen=True, slots=True)
class WarmState:
    """A prepared state: the image a group starts from, and what preparing it took."""

    image: str
    seconds: float
    setup_output: str = ""


async def prepare_state(
    runtime: Runtime,
    spec: Spec,
    *,
    setup: str | list[str] | None = None,
    timeout: float = 600.0,
) -> WarmState:
    """``spec.image`` with ``setup`` run in it once and committed (labelled with ``spec``'s
    lease, so it goes with its run); without ``setup``, ``spec.image`` itself. A setup that
    fails is a ``ContainerError`` carrying its output: a group never starts from half a state."""
    started = time.monotonic()
    if setup is None:
        return WarmState(spec.image, 0.0)
    box = await runtime.create(spec, timeout=timeout)
    try:
        done = await box.exec(setup, timeout=timeout, max_output=16384)
        if done.timed_out or done.exit_code != 0:
            raise ContainerError(
                f"the setup step of {spec.image} failed "
                f"({'past its deadline' if done.timed_out else f'exit {done.exit_code}'})",
                body=(done.stdout + done.stderr)[-4000:],
                endpoint="setup",
            )
        await box.stop_processes(timeout=timeout)
        image = await box.snapshot(timeout=timeout)
    finally:
        await box.destroy()
    return WarmState(image, time.monotonic() - started, done.stdout)


async def start_group(
    runtime: Runtime,
    spec: Spec,
    n: int,
    *,
    timeout: float = 120.0,
    parallel: int = 8,
) -> list[Container]:
    """``n`` containers of ``spec`` (at most ``parallel`` starting at once). All or none: when
    one cannot start, the others are removed and its error raised."""
    gate = asyncio.Semaphore(max(1, parallel))
    made: list[Container] = []

    async def one() -> Container:
        async with gate:
            box = await runtime.create(spec, timeout=timeout)
            made.append(box)
            return box

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        await asyncio.gather(*(box.destroy() for box in made), return_exceptions=True)
        raise failures[0]
    return [r for r in results if not isinstance(r, BaseException)]


async def warm_group(
    runtime: Runtime,
    spec: Spec,
    n: int,
    *,
    setup: str | list[str] | None = None,
    timeout: float = 600.0,
) -> tuple[WarmState, list[Container]]:
    """Prepare ``spec.image`` once (``prepare_state``) and start ``n`` containers from it."""
    state = await prepare_state(runtime, spec, setup=setup, timeout=timeout)
    group = await start_group(runtime, replace(spec, image=state.image), n, timeout=timeout)
    return state, group
