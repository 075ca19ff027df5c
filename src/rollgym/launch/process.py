"""One server process: its listening socket, its process, its log. Shared by the local
supervisor and the Ray hosts, which differ only in where the process runs."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

SPEC_ENV = "ROLLGYM_WORKER"
"""The environment variable carrying a server process's JSON spec. Defined here, not in the
worker module: ``python -m rollgym.launch.worker`` imports this package first, and a package
that had already imported the worker would run it twice (runpy warns about exactly that)."""


@dataclass
class ServerProcess:
    """A replica of a server: bound before it starts, so every URL is known up front."""

    name: str
    replica: int
    url: str
    sock: Any  # socket.socket until the process holds it, then None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    log_file: IO[bytes] | None = field(default=None, repr=False)

    def spawn(
        self,
        config: dict[str, Any],
        urls: dict[str, list[str]],
        *,
        log_dir: Path | None,
        log_name: str,
        log_level: str,
    ) -> subprocess.Popen[bytes]:
        """Start ``python -m rollgym.launch.worker`` on this replica's socket."""
        assert self.sock is not None
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
        out: IO[bytes] | None = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = log_dir / log_name
            self.log_file = out = open(self.log_path, "ab")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollgym.launch.worker"],
            env=env,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,  # Ctrl-C reaches the launcher only; it stops us in order
        )
        self.sock.close()  # the child holds its own copy: once it dies, connects are refused
        self.sock = None
        return self.proc

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"; last lines of {self.log_path}:\n  " + "\n  ".join(tail)

    def close(self) -> None:
        """Close what this process left open here (its log file, an unspawned socket)."""
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
