"""One server process: its listening socket, its process, its log, and how it is stopped.

The only place rollgym starts or stops a server process; the local supervisor and the Ray
hosts both go through it and differ only in where the process runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollgym.import_path import absolute_pythonpath, relative_elements
from rollgym.launch.ports import bind_socket, socket_url
from rollgym.launch.timeouts import STARTUP_TIMEOUT as STARTUP_TIMEOUT  # the supervisor's, too

WORKER = "rollgym.cli.worker"
"""The module a server process runs (``python -P -m``: the working directory is not searched):
an entry point, which lists the dialects and runs ``rollgym.launch.worker.main``. Named, never
imported here: the launcher does not depend on what the entry point lists."""

SPEC_FD_FLAG = "--spec-fd"
"""``python -m rollgym.cli.worker --spec-fd N``: the descriptor holding the server's JSON spec
(its name, the run's config with its credentials, every server's URLs). Not an environment
variable: a server's environment is inherited by whatever it starts (a sandboxed program) and
stays readable in ``/proc/<pid>/environ`` for the server's whole life; the descriptor is of an
unnamed file that the worker reads once and closes before it serves anything (``read_spec``).
Defined here, not in the worker module: the worker imports this module, and the launcher must
not import the worker."""

_KEY_OPTION = re.compile(r"(key|token|secret|password)_env$")
"""Options naming the environment variable of a credential (``api_key_env: VLLM_API_KEY``):
that variable goes, in the spec, only to the server whose options name it."""

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
        """Start ``python -P -m rollgym.cli.worker`` on this replica's socket; return its
        pid. ``config`` is the run's ``Config.model_dump(mode="json")``, ``urls`` every
        server's."""
        if self.sock is None:
            raise RuntimeError(f"server {self.name} replica {self.replica} is not bound")
        fd = self.sock.fileno()
        secret_vars = _credential_vars(config)
        own = secret_vars.get(self.name, set())
        spec = {
            "name": self.name,
            "config": config,
            "urls": urls,
            "fd": fd,
            "parent": os.getpid(),  # the worker ties its life to ours
            "log_level": log_level,
            # The credential variables this server's options name, for its own process only.
            "env": {var: os.environ[var] for var in sorted(own) if var in os.environ},
        }
        every = set().union(*secret_vars.values())
        env = {var: value for var, value in os.environ.items() if var not in every}
        if "PYTHONPATH" in env:
            env["PYTHONPATH"] = server_pythonpath(env["PYTHONPATH"])
        # The child writes to its own copy of the log's descriptor (and reads its own copy of
        # the spec's): ours close right away.
        with contextlib.ExitStack() as held:
            out = open_log(self.log_path, held) if self.log_path is not None else None
            spec_fd = held.enter_context(_spec_file(orjson.dumps(spec)))
            self.proc = subprocess.Popen(
                # -P: ``-m`` would put the working directory first on sys.path, and a file
                # there named like a module the server imports (its environment, a
                # verifier's dependency) would replace it. A server imports from the
                # installed packages, PYTHONPATH's absolute folders (server_pythonpath) and
                # its config's folder (resolve_impl) only.
                [sys.executable, "-P", "-m", WORKER, SPEC_FD_FLAG, str(spec_fd)],
                env=env,
                pass_fds=(fd, spec_fd),
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


@functools.cache
def server_pythonpath(pythonpath: str) -> str:
    """``PYTHONPATH`` for a server process: its absolute folders only. An empty element (what
    ``export PYTHONPATH=$PYTHONPATH:/x`` leaves) or a relative one is resolved against the
    working directory, and ``-P`` leaves it in (``rollgym.import_path``). Said once per value,
    since a folder dropped may hold the code a config names."""
    dropped = relative_elements(pythonpath)
    if any(dropped):
        log.warning(
            "PYTHONPATH: %s not searched by server processes (relative to the working "
            "directory, where any file could replace a module they import); give absolute "
            "paths", ", ".join(repr(part) for part in dropped if part),
        )  # fmt: skip
    return absolute_pythonpath(pythonpath)


def read_spec(argv: list[str]) -> dict[str, Any]:
    """The spec a server process was started with (``--spec-fd N`` in ``argv``), read once:
    the descriptor is closed here, and its file has no name, so nothing of the spec is left
    for a process this one starts to read."""
    try:
        fd = int(argv[argv.index(SPEC_FD_FLAG) + 1])
    except (ValueError, IndexError):
        raise SystemExit(f"usage: python -m {WORKER} {SPEC_FD_FLAG} FD") from None
    with open(fd, "rb") as spec:  # closes ``fd``
        data: dict[str, Any] = orjson.loads(spec.read())
    return data


def open_log(path: Path, stack: contextlib.ExitStack) -> int:
    """A descriptor appending to the log at ``path``, never through a symbolic link (neither
    ``path`` nor its directory may be one: a link planted there would point our writes, as
    this user, anywhere). ``OSError`` (``ELOOP``, ``ENOTDIR``) otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    where = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | nofollow | os.O_CLOEXEC
        fd = os.open(path.name, flags, 0o644, dir_fd=where)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot open the log {path}: {exc.strerror}") from None
    finally:
        os.close(where)
    stack.callback(os.close, fd)
    return fd


@contextlib.contextmanager
def _spec_file(spec: bytes) -> Iterator[int]:
    """A descriptor of an unnamed file holding ``spec``, at its start: an anonymous memory
    file, or a private temporary file unlinked at once where there is none."""
    try:
        fd = os.memfd_create("rollgym-worker-spec", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, name = tempfile.mkstemp(prefix="rollgym-spec-")  # mode 0600
        os.unlink(name)
    try:
        with open(fd, "wb", closefd=False) as out:
            out.write(spec)
        os.lseek(fd, 0, os.SEEK_SET)  # the child reads through the same open file
        yield fd
    finally:
        os.close(fd)


def _credential_vars(config: dict[str, Any]) -> dict[str, set[str]]:
    """Server name -> the environment variables of credentials its options name."""
    found: dict[str, set[str]] = {}

    def walk(name: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, str) and _KEY_OPTION.search(str(key)):
                    found.setdefault(name, set()).add(item)
                else:
                    walk(name, item)
        elif isinstance(value, list):
            for item in value:
                walk(name, item)

    for name, server in (config.get("servers") or {}).items():
        walk(name, (server or {}).get("options"))
    return found


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    # Polled rather than ``to_thread(proc.wait)``: a group stops many processes at once and
    # the default thread pool is small, so queued waits would stretch the grace period.
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True
