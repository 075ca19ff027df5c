"""A config's servers, started from Python: what ``rollgym serve`` does, as a context manager.

    with rollgym.serve_config("config.yaml") as servers:          # or: async with
        groups = servers.client.collect_sync(servers.rows()[:8], repeats=4)

The servers run as processes through the same launcher as ``rollgym serve`` and ``rollgym run``
(``rollgym.launch.Supervisor``): each waits for ``/health`` before the block starts, a server
that dies is started again, and leaving the block stops them all (SIGTERM, then SIGKILL), on an
exception too. Servers the config gives by ``url:`` are used, never started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from rollgym.collect.tasks import iter_tasks
from rollgym.config import Config, load_config, parse_config
from rollgym.errors import ConfigError
from rollgym.launch.process import STARTUP_TIMEOUT
from rollgym.launch.supervisor import Supervisor
from rollgym.launch.timeouts import WARMUP_TIMEOUT
from rollgym.trainer import RolloutClient

__all__ = ["ServeConfig", "Servers", "serve_config"]

T = TypeVar("T")
log = logging.getLogger("rollgym.serving")


@dataclass(frozen=True)
class Servers:
    """A config's servers, up and healthy. ``urls``: every server's URLs by name (a server with
    replicas has several); ``agent``: the server rows go to (``collect.agent``, else the only
    agent); ``client``: a ``RolloutClient`` for it, closed when the servers stop."""

    config: Config
    urls: Mapping[str, list[str]]
    agent: str
    client: RolloutClient

    def rows(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The task rows of the config's ``collect.input`` (the first ``limit``)."""
        if self.config.collect.input is None:
            raise ConfigError(f"{self.config.source or 'config'}: collect.input names no rows")
        return list(iter_tasks(self.config.base_dir() / self.config.collect.input, limit))


def serve_config(
    config: str | Path | Config | Mapping[str, Any],
    *,
    agent: str | None = None,
    log_dir: str | Path | None = None,
    log_level: str = "WARNING",
    startup_timeout: float = STARTUP_TIMEOUT,
    warmup_timeout: float = WARMUP_TIMEOUT,
) -> ServeConfig:
    """Start the servers of ``config`` (a YAML path, a ``Config``, or the same as a dict) on
    this machine; ``with`` or ``async with`` it to get their ``Servers``. ``agent``: which
    agent server the client calls (default as ``rollgym run``); ``log_dir``: a file per server
    there (default: their output goes to this process's stderr); ``startup_timeout``: seconds
    for every server to answer ``/health``; ``warmup_timeout``: seconds, from its start, for one
    that answers it is warming up (a scoring pool) to be ready (``rollgym.launch.timeouts``)."""
    if isinstance(config, Config):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = parse_config(dict(config), source="<dict>")
    else:
        cfg = load_config(config)
    name = cfg.agent_name(agent)  # a config with no agent to call fails here, before starting
    folder = Path(log_dir) if log_dir is not None else None
    return ServeConfig(cfg, name, folder, log_level, startup_timeout, warmup_timeout)


class ServeConfig:
    """What ``serve_config`` returns: a context manager, sync (the servers' supervisor runs on
    a background event-loop thread) or async (on the running loop). Enter it once."""

    def __init__(
        self,
        config: Config,
        agent: str,
        log_dir: Path | None,
        log_level: str,
        timeout: float,
        warmup_timeout: float = WARMUP_TIMEOUT,
    ) -> None:
        self._args = (config, agent, log_dir, log_level, timeout, warmup_timeout)
        self._async: AbstractAsyncContextManager[Servers] | None = None
        self._sync: contextlib.ExitStack | None = None

    async def __aenter__(self) -> Servers:
        if self._async is not None or self._sync is not None:
            raise RuntimeError("serve_config(...) is entered once; call it again for more")
        self._async = _serve(*self._args)
        return await self._async.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._async is not None
        await self._async.__aexit__(kind, exc, tb)

    def __enter__(self) -> Servers:
        if self._async is not None or self._sync is not None:
            raise RuntimeError("serve_config(...) is entered once; call it again for more")
        self._sync = contextlib.ExitStack()
        # The client's sync methods run on a loop thread of their own: the one here only
        # starts, watches and stops the server processes.
        servers = self._sync.enter_context(
            in_thread(
                _serve(*self._args, close_client=False), max(self._args[4], self._args[5]) + 30
            )
        )
        self._sync.callback(servers.client.close)  # first out: no pool outlives its servers
        return servers

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._sync is not None
        self._sync.close()


@asynccontextmanager
async def _serve(
    config: Config,
    agent: str,
    log_dir: Path | None,
    log_level: str,
    timeout: float,
    warmup_timeout: float,
    *,
    close_client: bool = True,
) -> AsyncIterator[Servers]:
    supervisor = Supervisor(
        config, log_dir=log_dir, log_level=log_level, startup_timeout=timeout,
        warmup_timeout=warmup_timeout,
    )  # fmt: skip
    try:
        urls = await supervisor.start()
        # As under `rollgym serve`: a server that dies is started again; one that keeps dying
        # is left down, and the rollouts that needed it fail as typed records.
        watch = asyncio.create_task(supervisor.watch(_crash_loop))
        client = RolloutClient(urls[agent], name=agent)
        try:
            yield Servers(config, urls, agent, client)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            if close_client:
                await client.aclose()
    finally:
        await supervisor.stop()


def _crash_loop(reason: str) -> None:
    log.error("%s", reason)


@contextmanager
def in_thread(manager: AbstractAsyncContextManager[T], timeout: float = 30.0) -> Iterator[T]:
    """Enter ``manager`` on a new event loop in a daemon thread; yield what it yields. For
    servers that keep serving while synchronous code (a trainer's step, a Ray ``get``) blocks
    this thread; ``timeout`` bounds entering and leaving."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="rollgym-background", daemon=True)
    thread.start()
    try:
        entering = asyncio.run_coroutine_threadsafe(manager.__aenter__(), loop)
        try:
            value = entering.result(timeout)
        except BaseException:
            # Cut short (the timeout, Ctrl-C): the entry is cancelled and left to undo what it
            # started (servers half up) before the loop stops.
            entering.cancel()
            asyncio.run_coroutine_threadsafe(_settle(), loop).result(timeout)
            raise
        try:
            yield value
        finally:
            exit_ = manager.__aexit__(None, None, None)
            asyncio.run_coroutine_threadsafe(exit_, loop).result(timeout)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        loop.close()


async def _settle() -> None:
    """Wait for every other task of this loop to finish."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    await asyncio.gather(*others, return_exceptions=True)
