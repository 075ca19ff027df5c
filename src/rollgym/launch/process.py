"""One server process: its listening socket, its process, its log, and how it is stopped.

The only place rollgym starts or stops a server process; the local supervisor and the Ray
hosts both go through it and differ only in where the process runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollgym.launch.ports import bind_socket, socket_url

STARTUP_TIMEOUT = 30.0
"""Seconds for every local server to answer ``/health``: imports and model loading included."""

SPEC_ENV = "ROLLGYM_WORKER"
"""The environment variable carrying a server process's JSON spec. Defined here, not in the
worker module: ``python -m rollgym.launch.worker`` imports this package first, and a package
that had already imported the worker would run it twice (runpy warns about exactly that)."""

STOP_GRACE = 10.0
"""Seconds a server gets to finish after SIGTERM before it is killed; above uvicorn's 5 s
graceful shutdown, so a healthy server always exits on its own."""

_POLL_S = 0.02
_TAIL_BYTES = 16_384

log = logging.getLogger("rollgym.launch")


@dataclass
class ServerProcess:
    """A replica of a server, bound before it starts, so every URL is known up front."""

    name: str
    replica: int
    sock: socket.socket | None  # until the process holds it
    url: str
    address: tuple[str, int]  # what ``sock`` is bound to; a restart binds it again
    log_path: Path | None = None
    node: str | None = None  # where it runs, for messages (a Ray node's address)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @classmethod
    def bind(
        cls,
        name: str,
        replica: int,
        host: str,
        port: int,
        *,
        url_host: str | None = None,
        log_path: Path | None = None,
        node: str | None = None,
    ) -> ServerProcess:
        """Listen on ``host:port`` for this replica; ``OSError`` if that address is taken."""
        sock = bind_socket(host, port)
        address = sock.getsockname()[:2]
        return cls(name, replica, sock, socket_url(sock, url_host), address, log_path, node)

    def exit_code(self) -> int | None:
        """The process's exit code once it has ended; None while it runs or before it starts."""
        return self.proc.poll() if self.proc is not None else None

    def describe(self) -> str:
        """Which replica, which process, where: for messages a person acts on."""
        parts = [f"replica {self.replica}"]
        if self.proc is not None:
            parts.append(f"pid {self.proc.pid}")
        parts.append(self.url if self.node is None else f"{self.url} on node {self.node}")
        return ", ".join(parts)

    def spawn(self, config: dict[str, Any], urls: dict[str, list[str]], log_level: str) -> int:
        """Start ``python -m rollgym.launch.worker`` on this replica's socket; return its pid.
        ``config`` is the run's ``Config.model_dump(mode="json")``, ``urls`` every server's."""
        if self.sock is None:
            raise RuntimeError(f"server {self.name} replica {self.replica} is not bound")
        fd = self.sock.fileno()
        spec = {
            "name": self.name,
            "config": config,
            "urls": urls,
            "fd": fd,
            "parent": os.getpid(),  # the worker ties its life to ours
            "log_level": log_level,
        }
        env = {**os.environ, SPEC_ENV: orjson.dumps(spec).decode()}
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The child writes to its own copy of the log's descriptor: ours closes right away.
        with open(self.log_path, "ab") if self.log_path else contextlib.nullcontext() as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rollgym.launch.worker"],
                env=env,
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,  # Ctrl-C reaches the launcher only; it stops us in order
            )
        self.close()  # the child holds its own copy: once it dies, connects are refused
        return self.proc.pid

    def rebind(self) -> None:
        """Listen on this replica's address again (after its process ended), to respawn it."""
        if self.sock is None:
            self.sock = bind_socket(*self.address)

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` of this replica's log, ready to append to a message."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as log_file:
                # Only the end: a server that ran for days has a long log.
                log_file.seek(max(0, log_file.seek(0, os.SEEK_END) - _TAIL_BYTES))
                text = log_file.read().decode(errors="replace")
        except OSError:
            return ""
        tail = text.splitlines()[-lines:]
        return f"; last lines of {self.log_path}:\n  " + "\n  ".join(tail) if tail else ""

    def kill(self) -> None:
        """SIGKILL the process now (fault tests and drills)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM, then SIGKILL if still running after ``grace`` seconds. Safe to repeat, and
        on a replica that never started (its socket is closed)."""
        self.close()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        if await _exited(proc, grace):
            return
        log.warning("server %s (%s) did not stop within %gs; killing it", self.name,
                    self.describe(), grace)  # fmt: skip
        proc.kill()
        await _exited(proc, grace)  # SIGKILL cannot be ignored: this reaps it at once

    def close(self) -> None:
        """Close the socket if no process took it (a launch that failed before spawning)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    # Polled rather than ``to_thread(proc.wait)``: a group stops many processes at once and
    # the default thread pool is small, so queued waits would stretch the grace period.
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True
