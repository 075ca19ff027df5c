"""Run untrusted Python in a child process under hard limits; never in the server's process.

Each run: a private temporary working directory (removed afterwards), an empty environment, a
new session (process group) killed as a whole at the wall limit, and ``launcher.py`` run by a
fresh ``python -I``, which sets the rlimits before the program's first line. Where the OS
allows (``unshare``, as root or with user namespaces) the run also gets its own network, PID and
mount namespaces: no network at all, no view of or signal to the server's processes, a
read-only file system but for the work dir, private ``/tmp``; run as root, the program also
drops to its own uid (one per parallel slot), which is what makes ``RLIMIT_NPROC`` bite. What
is (not) guaranteed is in the README ("The code environment's sandbox").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from rollgym.errors import SandboxError

log = logging.getLogger("rollgym.envs.code")

LAUNCHER = str(Path(__file__).with_name("launcher.py"))
SETUP_FAILED_EXIT = 120
_STDERR_KEEP = 8192
_NAMESPACES = ["--net", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc"]


@dataclass(frozen=True)
class Limits:
    """What one run may use. Memory is address space (``RLIMIT_AS``), not resident memory."""

    cpu_seconds: int = 2
    wall_seconds: float = 6.0
    memory_bytes: int = 512 * 2**20
    processes: int = 16
    open_files: int = 64
    file_bytes: int = 16 * 2**20
    output_bytes: int = 2**20


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox use; found once by probing."""

    namespaces: bool
    user_namespace: bool
    switch_uid: bool

    def describe(self) -> str:
        if not self.namespaces:
            return "rlimits + process group only (no unshare): sockets blocked from Python code"
        uid = "own uid per slot" if self.switch_uid else "same uid as the server"
        return f"network/PID/mount namespaces, read-only file system, {uid}"


@dataclass(frozen=True)
class RunResult:
    """How one run ended. ``exit_code`` is negative for a signal (as ``subprocess`` says)."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_exceeded: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_exceeded


Mode = Literal["stdio", "call", "assert"]


def probe_isolation() -> Isolation:
    """Which isolation works here: one ``unshare`` dry run (a second or less, done once)."""
    unshare = shutil.which("unshare")
    root = os.geteuid() == 0
    if unshare is None:
        return Isolation(namespaces=False, user_namespace=False, switch_uid=False)
    # Not root: only a user namespace lets us make the others.
    userns = [] if root else ["--user", "--map-root-user"]
    try:
        done = subprocess.run(
            [unshare, *userns, *_NAMESPACES, "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0:
        return Isolation(namespaces=False, user_namespace=False, switch_uid=False)
    return Isolation(namespaces=True, user_namespace=bool(userns), switch_uid=root)


class Sandbox:
    """Runs programs, at most ``parallel`` at a time, each under ``limits``."""

    def __init__(
        self, limits: Limits, *, parallel: int, uid_base: int, isolation: Isolation, server: str
    ) -> None:
        self.limits = limits
        self.isolation = isolation
        self.server = server
        self.uid_base = uid_base
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(parallel):
            self._slots.put_nowait(slot)

    async def run(
        self, program: str, stdin: str, *, mode: Mode = "stdio", fn_name: str | None = None
    ) -> RunResult:
        """Run ``program`` (Python source) with ``stdin``; raise ``SandboxError`` if the sandbox
        itself could not start it."""
        slot = await self._slots.get()
        uid = self.uid_base + slot if self.isolation.switch_uid else None
        try:
            workdir = await asyncio.to_thread(_workdir, program, uid)
        except BaseException:
            self._slots.put_nowait(slot)
            raise
        try:
            return await self._run(uid, workdir, program, stdin, mode, fn_name)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)
            self._slots.put_nowait(slot)

    def _command(self, spec: dict[str, Any]) -> list[str]:
        launch = [sys.executable, "-I", LAUNCHER, orjson.dumps(spec).decode()]
        if not self.isolation.namespaces:
            return launch
        unshare = shutil.which("unshare") or "unshare"
        userns = ["--user", "--map-root-user"] if self.isolation.user_namespace else []
        return [unshare, *userns, *_NAMESPACES, *launch]

    async def _run(
        self,
        uid: int | None,
        workdir: str,
        program: str,
        stdin: str,
        mode: Mode,
        fn_name: str | None,
    ) -> RunResult:
        ready_r, ready_w = os.pipe()
        spec = {
            "limits": asdict(self.limits),
            "uid": uid,
            "isolate_fs": self.isolation.namespaces,
            "block_net": not self.isolation.namespaces,
            "ready_fd": ready_w,
            "mode": mode,
            "program": "solution.py",
            "fn_name": fn_name,
        }
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._command(spec),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=workdir,
                env=env,
                start_new_session=True,
                pass_fds=(ready_w,),
            )
        except OSError as exc:
            os.close(ready_r)
            raise SandboxError(f"cannot start the sandbox: {exc}", server=self.server) from None
        finally:
            os.close(ready_w)
        try:
            result = await self._supervise(proc, stdin, started)
            ready = _read_ready(ready_r)
        finally:
            _kill_group(proc.pid)
            os.close(ready_r)
        if not ready:
            raise SandboxError(
                f"the sandbox could not start the program (exit {result.exit_code}): "
                f"{result.stderr.strip()[-1000:] or 'no message'}",
                server=self.server,
            )
        return result

    async def _supervise(
        self, proc: asyncio.subprocess.Process, stdin: str, started: float
    ) -> RunResult:
        assert proc.stdin and proc.stdout and proc.stderr
        over = asyncio.Event()
        feed = asyncio.create_task(_feed(proc.stdin, stdin.encode()))
        out = asyncio.create_task(_read(proc.stdout, self.limits.output_bytes, over))
        err = asyncio.create_task(_read(proc.stderr, _STDERR_KEEP, None))
        waiter = asyncio.create_task(proc.wait())
        stopper = asyncio.create_task(over.wait())
        done, _ = await asyncio.wait(
            {waiter, stopper}, timeout=self.limits.wall_seconds, return_when="FIRST_COMPLETED"
        )
        timed_out = not done
        stopper.cancel()
        if waiter not in done:
            _kill_group(proc.pid)
        # Killed or not, the process is gone within moments; its pipes close with it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), 5)
        readers = await asyncio.wait({feed, out, err}, timeout=2)
        for task in readers[1]:
            task.cancel()
        stdout = out.result() if out.done() and not out.cancelled() else b""
        stderr = err.result() if err.done() and not err.cancelled() else b""
        return RunResult(
            exit_code=proc.returncode,
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            timed_out=timed_out and not over.is_set(),
            output_exceeded=over.is_set(),
            duration_s=time.monotonic() - started,
        )


def _workdir(program: str, uid: int | None) -> str:
    """A fresh private work dir holding the program, owned by the run's uid."""
    workdir = tempfile.mkdtemp(prefix="rollgym-code-")
    Path(workdir, "solution.py").write_text(program, encoding="utf-8")
    if uid is not None:
        os.chown(workdir, uid, uid)
        os.chown(Path(workdir, "solution.py"), uid, uid)
    return workdir


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    # A program that never reads its input, or dies, closes the pipe under us: not an error.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
        pipe.close()


async def _read(pipe: asyncio.StreamReader, cap: int, over: asyncio.Event | None) -> bytes:
    """Up to ``cap`` bytes of ``pipe``; past it, set ``over`` (the run is then stopped). The
    rest is read and dropped: the pipe must reach its end for the process to count as done,
    and the program must never block on a full pipe."""
    kept = bytearray()
    while chunk := await pipe.read(65536):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room and over is not None:
            over.set()
    return bytes(kept)


def _read_ready(fd: int) -> bool:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 16).startswith(b"ready")
    except BlockingIOError:
        return False


def _kill_group(pid: int) -> None:
    # The run's session: the launcher (or unshare, whose --kill-child takes the whole PID
    # namespace down with it) and everything it started that stayed in the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
