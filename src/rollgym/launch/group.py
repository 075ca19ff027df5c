"""A group of server processes launched together: bind all, spawn all, wait healthy, stop all.

Binding every socket before spawning anything is what lets each server be told where all the
others are, with no port race. The local ``Supervisor`` runs one group for a whole config; on a
Ray cluster each node's ``ServerHost`` runs one group for the replicas placed on it, and the
steps are split so that every node binds before any node spawns.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollgym.errors import LaunchError
from rollgym.launch.health import wait_healthy
from rollgym.launch.process import STOP_GRACE, ServerProcess
from rollgym.launch.timeouts import WARMUP_TIMEOUT


@dataclass(frozen=True)
class ServerSpec:
    """One replica to launch: its server's name, where it listens, what its log is called."""

    name: str
    replica: int = 0
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    url_host: str | None = None  # the host in its URL when ``host`` is a wildcard address
    log_name: str | None = None  # under the group's log dir; None: "<name>.<replica>.log"


class ProcessGroup:
    """Server processes started and stopped together. ``config`` is the run's
    ``Config.model_dump(mode="json")``, handed to every process; ``node`` names the machine in
    messages (a Ray node's address); ``stop_grace``: seconds between SIGTERM and SIGKILL;
    ``warmup_timeout``: seconds a server that says it is warming up may take (``health``)."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        log_dir: Path | None = None,
        log_level: str = "WARNING",
        node: str | None = None,
        stop_grace: float = STOP_GRACE,
        warmup_timeout: float = WARMUP_TIMEOUT,
    ) -> None:
        self.config = config
        self.stop_grace = stop_grace
        self.warmup_timeout = warmup_timeout
        self.log_dir = log_dir
        self.log_level = log_level
        self.node = node
        self.servers: list[ServerProcess] = []
        self.urls: dict[str, list[str]] = {}  # every server of the run, as told to the processes

    async def start(
        self, specs: list[ServerSpec], urls: dict[str, list[str]], timeout: float
    ) -> dict[str, list[str]]:
        """Bind ``specs``, spawn them told of their URLs and of ``urls`` (servers running
        elsewhere), wait until all are healthy; return every URL by name. On any failure
        the group is stopped before the error propagates."""
        try:
            every = {name: list(found) for name, found in urls.items()}
            for spec in specs:
                every.setdefault(spec.name, []).append(self.bind(spec).url)
            self.spawn(every)
            await self.wait_healthy(timeout)
        except BaseException:
            await self.stop()
            raise
        return every

    def bind(self, spec: ServerSpec) -> ServerProcess:
        """Listen for ``spec``'s replica; ``LaunchError`` naming it if the address is taken."""
        log_name = spec.log_name or f"{spec.name}.{spec.replica}.log"
        try:
            server = ServerProcess.bind(
                spec.name,
                spec.replica,
                spec.host,
                spec.port,
                url_host=spec.url_host,
                log_path=self.log_dir / log_name if self.log_dir else None,
                node=self.node,
            )
        except OSError as exc:
            where = f" on node {self.node}" if self.node else ""
            raise LaunchError(
                f"server {spec.name}: cannot listen on {spec.host}:{spec.port}{where}: "
                f"{exc.strerror or exc}",
                server=spec.name,
            ) from None
        self.servers.append(server)
        return server

    def spawn(self, urls: dict[str, list[str]]) -> dict[str, int]:
        """Start every bound replica not started yet, telling each ``urls`` (every server of
        the run); return ``name.replica`` -> pid."""
        self.urls = urls
        return {
            f"{s.name}.{s.replica}": s.spawn(self.config, urls, self.log_level)
            for s in self.servers
            if s.proc is None
        }

    async def wait_healthy(self, timeout: float, warmup_timeout: float | None = None) -> None:
        """Wait until every started replica answers ``/health`` (see ``health.wait_healthy``;
        ``warmup_timeout`` None: the group's)."""
        warm = self.warmup_timeout if warmup_timeout is None else warmup_timeout
        await wait_healthy(self.servers, timeout, warm)

    def find(self, name: str, replica: int = 0) -> ServerProcess:
        for server in self.servers:
            if server.name == name and server.replica == replica:
                return server
        raise LaunchError(f"no server {name} replica {replica} in this group", server=name)

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.servers if s.proc is not None]

    def poll(self) -> dict[str, int]:
        """``name.replica`` -> exit code of every replica whose process has ended."""
        return {
            f"{s.name}.{s.replica}": code
            for s in self.servers
            if (code := s.exit_code()) is not None
        }

    async def restart(self, name: str, replica: int, timeout: float) -> None:
        """Start a replica whose process ended again, on the same address, and wait for it."""
        server = self.find(name, replica)
        if server.proc is not None and server.proc.poll() is None:
            raise LaunchError(f"server {name} replica {replica} is still running", server=name)
        try:
            server.rebind()
        except OSError as exc:
            raise LaunchError(
                f"server {name}: cannot listen on {server.url} again: {exc.strerror or exc}",
                server=name,
            ) from None
        try:
            server.spawn(self.config, self.urls, self.log_level)
        except BaseException:
            # Nobody will accept on the re-bound socket: close it, so callers are refused
            # (and fail over) instead of waiting in its backlog.
            server.close()
            raise
        await wait_healthy([server], timeout, self.warmup_timeout)

    async def stop(self) -> None:
        """Stop every replica at once: SIGTERM, then SIGKILL after the grace period; also
        close sockets never handed to a process. Idempotent."""
        await asyncio.gather(*(s.stop(self.stop_grace) for s in self.servers))
