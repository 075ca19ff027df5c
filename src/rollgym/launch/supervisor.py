"""The process supervisor behind ``rollgym serve`` and ``rollgym run``.

Ports are bound here, before any server starts, and each listening socket is handed to its
server process; so every server is told where the others are without a port race. Children get
SIGTERM if this process dies (Linux parent-death signal), so no orphan outlives its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import subprocess
import time
from pathlib import Path

import aiohttp

from rollgym.config import Config
from rollgym.errors import LaunchError
from rollgym.launch.process import ServerProcess
from rollgym.server.base import check_servers

log = logging.getLogger("rollgym.launch")


class Supervisor:
    """Start the servers of ``config`` (all but those given by ``url``), and stop them."""

    def __init__(
        self, config: Config, *, log_dir: Path | None = None, log_level: str = "WARNING"
    ) -> None:
        self.config = config
        self.log_dir = log_dir
        self.log_level = log_level
        self.servers: list[ServerProcess] = []
        self.urls: dict[str, list[str]] = {}

    def _bind(self) -> None:
        check_servers(self.config)  # an unknown impl, a mistyped option, a missing peer
        for name, cfg in self.config.servers.items():
            if cfg.url:
                self.urls[name] = [cfg.url.rstrip("/")]
                continue
            for replica in range(cfg.replicas):
                port = (cfg.port + replica) if cfg.port else 0
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((cfg.host, port))
                except OSError as exc:
                    sock.close()
                    raise LaunchError(
                        f"server {name}: cannot listen on {cfg.host}:{port}: {exc.strerror}",
                        server=name,
                    ) from None
                sock.listen(4096)
                host, bound = sock.getsockname()[:2]
                url = f"http://{host}:{bound}"
                self.servers.append(ServerProcess(name, replica, url, sock))
                self.urls.setdefault(name, []).append(url)

    def _spawn(self, server: ServerProcess) -> None:
        suffix = f".{server.replica}" if self.config.servers[server.name].replicas > 1 else ""
        server.spawn(
            self.config.model_dump(mode="json"),
            self.urls,
            log_dir=self.log_dir,
            log_name=f"{server.name}{suffix}.log",
            log_level=self.log_level,
        )

    async def start(self, timeout: float = 30.0) -> dict[str, list[str]]:
        """Start every server and wait until each answers ``/health``; return name -> URLs."""
        try:
            self._bind()  # inside: a bind that fails must not leak the sockets bound before it
            for server in self.servers:
                self._spawn(server)
            await self._wait_healthy(timeout)
        except BaseException:
            await self.stop()
            raise
        return self.urls

    async def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(self.servers)
        probe_timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=probe_timeout) as session:
            while pending:
                for server in list(pending):
                    assert server.proc is not None
                    code = server.proc.poll()
                    if code is not None:
                        raise LaunchError(
                            f"server {server.name} exited with code {code} while starting"
                            + server.log_tail(),
                            server=server.name,
                        )
                    try:
                        async with session.get(server.url + "/health") as resp:
                            if resp.status == 200:
                                pending.remove(server)
                    except (aiohttp.ClientError, TimeoutError):
                        pass  # not listening yet
                if not pending:
                    return
                if time.monotonic() > deadline:
                    names = ", ".join(s.name for s in pending)
                    raise LaunchError(f"servers not healthy after {timeout:g}s: {names}")
                await asyncio.sleep(0.05)

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every child, wait up to ``timeout``, then SIGKILL what is left."""
        for server in self.servers:
            if server.proc is not None and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for server in self.servers:
            proc = server.proc
            if proc is not None:
                remaining = max(0.0, deadline - time.monotonic())
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(proc.wait, remaining)
                if proc.poll() is None:
                    log.warning(
                        "server %s did not stop within %gs; killing it", server.name, timeout
                    )
                    proc.kill()
                    proc.wait()
            # A server never spawned (an earlier one failed to start) still holds its socket.
            server.close()

    def kill(self, name: str, replica: int = 0) -> None:
        """SIGKILL one server process (fault tests)."""
        for server in self.servers:
            if server.name == name and server.replica == replica and server.proc is not None:
                server.proc.kill()
                server.proc.wait()

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.servers if s.proc is not None]

    async def restart(self, name: str, replica: int = 0, timeout: float = 30.0) -> None:
        """Start a killed server again on the same port (fault tests: a server comes back)."""
        for server in self.servers:
            if server.name != name or server.replica != replica:
                continue
            if server.proc is not None and server.proc.poll() is None:
                raise LaunchError(f"server {name} is still running", server=name)
            host, port = server.url.removeprefix("http://").rsplit(":", 1)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
            sock.listen(4096)
            server.sock = sock
            if server.log_file is not None:
                server.log_file.close()
            self._spawn(server)
            await self._wait_healthy_one(server, timeout)
            return
        raise LaunchError(f"no server {name} replica {replica} in this run", server=name)

    async def _wait_healthy_one(self, server: ServerProcess, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
            while time.monotonic() < deadline:
                try:
                    async with session.get(server.url + "/health") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.05)
        raise LaunchError(f"server {server.name} not healthy after restart", server=server.name)
