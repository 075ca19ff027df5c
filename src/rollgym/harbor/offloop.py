"""A ``Runtime`` whose calls run on a stock asyncio loop in a thread of their own.

rollgym's servers run on uvloop, and under uvloop a child process started with pipes leaks
duplicates of them that do not close on exec: podman's ``conmon`` inherits them, so a
``podman run -d`` read to the end of its output returns only when the container exits. Until the
podman provider reads its output another way, the harbor server hands every container call to
this wrapper when its own loop is not asyncio's (``wrap_for_loop``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from rollgym.containers.runtime import Container, ExecResult, Runtime, Spec

T = TypeVar("T")


class _Loop:
    """One stock asyncio loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rollgym-containers", daemon=True
        )
        self.thread.start()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))


class OffLoopContainer:
    def __init__(self, inner: Container, loop: _Loop) -> None:
        self.inner = inner
        self._loop = loop

    @property
    def id(self) -> str:
        return self.inner.id

    async def exec(self, command: list[str] | str, **kw: Any) -> ExecResult:
        return await self._loop.call(self.inner.exec(command, **kw))

    async def put(self, source: Path, dest: str, *, timeout: float) -> None:
        await self._loop.call(self.inner.put(source, dest, timeout=timeout))

    async def get(self, source: str, dest: Path, *, timeout: float) -> None:
        await self._loop.call(self.inner.get(source, dest, timeout=timeout))

    async def snapshot(self, *, timeout: float) -> str:
        return await self._loop.call(self.inner.snapshot(timeout=timeout))

    async def stop_processes(self, *, timeout: float) -> None:
        await self._loop.call(self.inner.stop_processes(timeout=timeout))

    async def destroy(self) -> None:
        await self._loop.call(self.inner.destroy())


class OffLoopRuntime:
    """``inner`` with every call made on a stock asyncio loop in a thread."""

    def __init__(self, inner: Runtime) -> None:
        self.inner = inner
        self.name = inner.name
        self._loop = _Loop()

    async def create(self, spec: Spec, *, timeout: float) -> Container:
        box = await self._loop.call(self.inner.create(spec, timeout=timeout))
        return OffLoopContainer(box, self._loop)

    async def remove_image(self, image: str, *, timeout: float) -> None:
        await self._loop.call(self.inner.remove_image(image, timeout=timeout))

    async def reap(self, *, now: float | None = None) -> list[str]:
        return await self._loop.call(self.inner.reap(now=now))


def wrap_for_loop(runtime: Runtime) -> Runtime:
    """``runtime`` as is on asyncio's own loop, else off the running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return runtime
    if type(loop).__module__.startswith("asyncio"):
        return runtime
    return OffLoopRuntime(runtime)
