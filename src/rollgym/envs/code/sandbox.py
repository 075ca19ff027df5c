"""Run untrusted Python in a child process under hard limits; never in the server's process.

Each run: ``launcher.py`` run by a fresh ``python -I`` with an empty environment, in a new
session (process group) killed as a whole at the wall limit; the launcher sets the rlimits
before the program's first line. The program, its input and (assert tests) the expressions to
evaluate arrive on standard input; nothing of a test's expected output ever enters the sandbox.
Where the OS allows (``unshare``, as root or with user namespaces) the run also gets its own
network, PID, IPC, UTS, cgroup and mount namespaces, and a new root holding only the
interpreter, its standard library and the shared libraries they load (read-only) and a size-
and inode-limited work dir that vanishes with the run; run as root, the program drops to its
own uid (one per parallel slot), which is what makes ``RLIMIT_NPROC`` bite; in a user namespace
it drops every capability. Without namespaces it still gets its own uid as root, and a Landlock
domain. What is (not) guaranteed is in the README ("The code environment's sandbox").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
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

from rollgym import tracing
from rollgym.envs.code.codec import ProbeSpec
from rollgym.envs.code.isolation import WORK_DIR, interpreter_files
from rollgym.envs.code.launcher import READY
from rollgym.errors import SandboxError
from rollgym.tracing.names import (
    SANDBOX_EXIT,
    SANDBOX_MODE,
    SANDBOX_OUTPUT_EXCEEDED,
    SANDBOX_SPAN,
    SANDBOX_TIMED_OUT,
    SERVER,
)

log = logging.getLogger("rollgym.envs.code")

LAUNCHER = str(Path(__file__).with_name("launcher.py"))
SETUP_FAILED_EXIT = 120
WEDGE_GRACE_S = 30.0
"""Seconds past its wall limit a run may hold its slot before the sandbox counts as wedged:
every run is killed at the wall limit, so only a sandbox that is broken gets there."""
_STDERR_KEEP = 8192
_NAMESPACES = ["--net", "--pid", "--ipc", "--uts", "--cgroup", "--mount", "--fork",
               "--kill-child", "--mount-proc"]  # fmt: skip


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
    work_bytes: int = 32 * 2**20
    work_inodes: int = 4096


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox use; found once by probing."""

    namespaces: bool
    user_namespace: bool
    switch_uid: bool

    def describe(self) -> str:
        if not self.namespaces:
            uid = "own uid per slot" if self.switch_uid else "Landlock (needed)"
            return (
                "rlimits + process group only (no unshare): sockets, child processes and "
                f"ctypes refused from Python code; the host's files readable; {uid} keeps "
                "other processes' environments out of reach"
            )
        uid = "own uid per slot" if self.switch_uid else "no capabilities"
        return f"network/PID/IPC/mount namespaces, a root of the standard library only, {uid}"


@dataclass(frozen=True)
class RunResult:
    """How one run ended. ``exit_code`` is negative for a signal (as ``subprocess`` says);
    ``report`` is what the launcher wrote after ``ready`` (call and assert tests' values)."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_exceeded: bool
    duration_s: float
    report: bytes = b""
    cpu_s: float = 0.0
    """CPU seconds (user + system) of the run's process and every descendant it waited for,
    from the kernel's accounting when it was reaped (``wait4``): the run's cost, where
    ``duration_s`` counts the time it held its slot, waiting included. A run stopped at its
    wall limit counts too: the launcher is killed first, and reaped into unshare's figure."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_exceeded


Mode = Literal["stdio", "call", "assert"]


def probe_isolation() -> Isolation:
    """Which isolation works here: one ``unshare`` dry run (a second or less, done once). As
    root a run gets its own uid with or without namespaces."""
    unshare = shutil.which("unshare")
    root = os.geteuid() == 0
    if unshare is None:
        return Isolation(namespaces=False, user_namespace=False, switch_uid=root)
    # Not root: only a user namespace lets us make the others.
    userns = [] if root else ["--user", "--map-root-user"]
    try:
        done = subprocess.run(
            [unshare, *userns, *_NAMESPACES, "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0:
        return Isolation(namespaces=False, user_namespace=False, switch_uid=root)
    _interpreter_files()  # found now, off the event loop, rather than in the first run
    return Isolation(namespaces=True, user_namespace=bool(userns), switch_uid=root)


@functools.cache
def _interpreter_files() -> tuple[str, ...]:
    """What the new root must hold besides the standard library (``ldd``: once a process)."""
    return tuple(interpreter_files())


class Sandbox:
    """Runs programs, at most ``parallel`` at a time, each under ``limits``."""

    def __init__(
        self, limits: Limits, *, parallel: int, uid_base: int, isolation: Isolation, server: str
    ) -> None:
        self.limits = limits
        self.isolation = isolation
        self.server = server
        self.uid_base = uid_base
        self.parallel = parallel
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        self._busy: dict[int, float] = {}  # slot -> when its run started
        for slot in range(parallel):
            self._slots.put_nowait(slot)

    @property
    def in_use(self) -> int:
        """Slots running a program now."""
        return len(self._busy)

    def wedged(self) -> str | None:
        """Why this sandbox can no longer be trusted to run anything, or None: a run that
        holds its slot long past the wall limit means a broken sandbox, not a slow program."""
        bound = self.limits.wall_seconds + WEDGE_GRACE_S
        now = time.monotonic()
        stuck = [slot for slot, since in self._busy.items() if now - since > bound]
        if not stuck:
            return None
        return f"{len(stuck)} sandbox slot(s) held for more than {bound:g}s (wall limit + grace)"

    async def run(
        self,
        program: str,
        stdin: str,
        *,
        mode: Mode = "stdio",
        fn_name: str | None = None,
        probes: tuple[ProbeSpec, ...] = (),
    ) -> RunResult:
        """Run ``program`` (Python source) with ``stdin``; raise ``SandboxError`` if the sandbox
        itself could not start it. The slot is given back however the run ends."""
        with tracing.span(SANDBOX_SPAN, {SANDBOX_MODE: mode, SERVER: self.server}) as span:
            result = await self._in_slot(program, stdin, mode, fn_name, probes)
            if span is not None:  # traced (rollgym.tracing): how the program ended
                span.set_attribute(SANDBOX_TIMED_OUT, result.timed_out)
                span.set_attribute(SANDBOX_OUTPUT_EXCEEDED, result.output_exceeded)
                if result.exit_code is not None:
                    span.set_attribute(SANDBOX_EXIT, result.exit_code)
            return result

    async def _in_slot(
        self,
        program: str,
        stdin: str,
        mode: Mode,
        fn_name: str | None,
        probes: tuple[ProbeSpec, ...],
    ) -> RunResult:
        slot = await self._slots.get()
        self._busy[slot] = time.monotonic()
        workdir: str | None = None
        try:
            if not self.isolation.namespaces:
                workdir = await asyncio.to_thread(tempfile.mkdtemp, prefix="rollgym-code-")
            uid = self.uid_base + slot if self.isolation.switch_uid else None
            # json, not orjson: model text may hold lone surrogates, which json escapes.
            header = json.dumps({"program": program, "probes": list(probes)}).encode()
            data = b"%d\n%b%b" % (len(header), header, stdin.encode("utf-8", "surrogatepass"))
            return await self._run(uid, workdir, data, mode, fn_name)
        finally:
            del self._busy[slot]
            self._slots.put_nowait(slot)
            if workdir is not None:
                await asyncio.to_thread(remove_tree, workdir)

    def _command(self, spec: dict[str, Any]) -> list[str]:
        launch = [sys.executable, "-I", LAUNCHER, orjson.dumps(spec).decode()]
        if not self.isolation.namespaces:
            return launch
        unshare = shutil.which("unshare") or "unshare"
        userns = ["--user", "--map-root-user"] if self.isolation.user_namespace else []
        return [unshare, *userns, *_NAMESPACES, *launch]

    async def _run(
        self, uid: int | None, workdir: str | None, data: bytes, mode: Mode, fn_name: str | None
    ) -> RunResult:
        control_r, control_w = os.pipe()
        spec: dict[str, Any] = {
            "limits": asdict(self.limits),
            "uid": uid,
            "isolate": self.isolation.namespaces,
            "control_fd": control_w,
            "mode": mode,
            "fn_name": fn_name,
        }
        if self.isolation.namespaces:
            spec["visible"] = list(await asyncio.to_thread(_interpreter_files))
        home = workdir or WORK_DIR
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": home, "TMPDIR": home}
        started = time.monotonic()
        try:
            # Popen, not asyncio's subprocess: its child watcher reaps with ``waitpid``, which
            # drops the CPU accounting that ``Reaped`` reads with ``wait4``. Started on the
            # loop, as asyncio's own subprocess transport starts its Popen.
            proc = subprocess.Popen(  # noqa: ASYNC220
                self._command(spec),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir or "/",
                env=env,
                start_new_session=True,
                pass_fds=(control_w,),
            )
        except OSError as exc:
            os.close(control_r)
            raise SandboxError(f"cannot start the sandbox: {exc}", server=self.server) from None
        finally:
            os.close(control_w)
        reaped = Reaped(proc)
        try:
            result = await self._supervise(proc, reaped, data, started, control_r)
        finally:
            _kill_group(proc.pid)
            reaped.close()
        if not result.report.startswith(READY):
            raise SandboxError(
                f"the sandbox could not start the program (exit {result.exit_code}): "
                f"{result.stderr.strip()[-1000:] or 'no message'}",
                server=self.server,
            )
        return result

    async def _supervise(
        self,
        proc: subprocess.Popen[bytes],
        reaped: Reaped,
        data: bytes,
        started: float,
        control: int,
    ) -> RunResult:
        assert proc.stdin and proc.stdout and proc.stderr
        over = asyncio.Event()
        pipes: list[asyncio.BaseTransport] = []
        try:
            control_pipe, reader = await _pipe_reader(control)
            pipes.append(control_pipe)
            stdin = await _pipe_writer(proc.stdin, pipes)
            stdout = await _pipe_reader_of(proc.stdout, pipes)
            stderr = await _pipe_reader_of(proc.stderr, pipes)
            return await self._watch(reaped, stdin, stdout, stderr, reader, data, started, over)
        finally:
            for pipe in pipes:
                pipe.close()

    async def _watch(
        self,
        reaped: Reaped,
        stdin: asyncio.StreamWriter,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        reader: asyncio.StreamReader,
        data: bytes,
        started: float,
        over: asyncio.Event,
    ) -> RunResult:
        proc = reaped.proc
        feed = asyncio.create_task(_feed(stdin, data))
        out = asyncio.create_task(_read(stdout, self.limits.output_bytes, over))
        err = asyncio.create_task(_read(stderr, _STDERR_KEEP, None))
        rep = asyncio.create_task(_read(reader, self.limits.output_bytes + len(READY), over))
        waiter = asyncio.ensure_future(reaped.done)
        stopper = asyncio.create_task(over.wait())
        racers: set[asyncio.Future[Any]] = {waiter, stopper}
        done, _ = await asyncio.wait(
            racers, timeout=self.limits.wall_seconds, return_when="FIRST_COMPLETED"
        )
        timed_out = not done
        stopper.cancel()
        if waiter not in done:
            if self.isolation.namespaces:
                # The launcher first: unshare reaps it (and the kernel its namespace's other
                # processes into it), so the run's CPU seconds are counted; killed at once with
                # unshare, nobody would count them.
                _kill_children(proc.pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), 1)
            _kill_group(proc.pid)
        # Killed or not, the process is gone within moments; its pipes close with it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), 5)
        readers = await asyncio.wait({feed, out, err, rep}, timeout=2)
        for task in readers[1]:
            task.cancel()
        return RunResult(
            exit_code=proc.returncode,
            stdout=_text(out),
            stderr=_text(err),
            timed_out=timed_out and not over.is_set(),
            output_exceeded=over.is_set(),
            duration_s=time.monotonic() - started,
            report=rep.result() if rep.done() and not rep.cancelled() else b"",
            cpu_s=reaped.cpu_s,
        )


class Reaped:
    """Reaps ``proc`` with ``wait4`` when it exits, keeping its CPU seconds (``cpu_s``): the
    kernel adds to a process's own accounting that of every descendant it waited for, so the
    launcher's figure holds the program's, and its children's (``unshare --fork`` waits for
    the launcher; in a PID namespace the launcher's orphans are reaped into it as it ends). The
    exit is seen through a pidfd on the event loop, or a thread where the kernel has none."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.cpu_s = 0.0
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = loop.create_future()
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self._thread = asyncio.ensure_future(asyncio.to_thread(self._reap, 0))
            self._thread.add_done_callback(self._threaded)
            return
        loop.add_reader(self._pidfd, self._exited)

    def _reap(self, flags: int) -> bool:
        """Reap the process if it has exited (``flags``: ``os.WNOHANG``, or 0 to wait)."""
        try:
            pid, status, usage = os.wait4(self.proc.pid, flags)
        except ChildProcessError:  # reaped by someone else: its figure is gone
            if self.proc.returncode is None:
                self.proc.returncode = -1
            return True
        if pid == 0:
            return False
        # Popen must not wait for it again (it would find no such child).
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s = usage.ru_utime + usage.ru_stime
        return True

    def _exited(self) -> None:
        if self._reap(os.WNOHANG):
            self.close()
            if not self.done.done():
                self.done.set_result(None)

    def _threaded(self, task: asyncio.Future[bool]) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        """Stop watching (the pidfd's reader); a process not yet reaped is reaped by the thread
        or by ``Popen``'s own clean-up."""
        if self._pidfd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


def _text(task: asyncio.Task[bytes]) -> str:
    data = task.result() if task.done() and not task.cancelled() else b""
    return data.decode("utf-8", errors="replace")


async def _pipe_reader(fd: int) -> tuple[asyncio.BaseTransport, asyncio.StreamReader]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return pipe, reader


async def _pipe_reader_of(
    pipe: Any, transports: list[asyncio.BaseTransport]
) -> asyncio.StreamReader:
    """A stream reading ``pipe`` (a ``Popen`` file); its transport joins ``transports``."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    transports.append(transport)
    return reader


async def _pipe_writer(pipe: Any, transports: list[asyncio.BaseTransport]) -> asyncio.StreamWriter:
    """A stream writing ``pipe`` (a ``Popen`` file); its transport joins ``transports``."""
    loop = asyncio.get_running_loop()
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader())
    transport, _ = await loop.connect_write_pipe(lambda: protocol, pipe)
    transports.append(transport)
    return asyncio.StreamWriter(transport, protocol, None, loop)


def remove_tree(path: str) -> None:
    """Remove a fallback run's work dir, however deep or unreadable the program left it;
    never raises (a leftover is logged). ``rm`` walks any depth, where ``shutil.rmtree``
    recurses and fails past about a thousand levels; ``chmod`` first, as the program may have
    taken its own permissions away."""
    for command in (["chmod", "-R", "u+rwx", "--", path], ["rm", "-rf", "--", path]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(command, capture_output=True, timeout=120, check=False)
    if os.path.lexists(path):
        with contextlib.suppress(Exception):
            shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        log.warning("could not remove the sandbox's work dir %s", path)


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


def _kill_children(pid: int) -> None:
    """SIGKILL the children of ``pid`` (unshare's: the launcher)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            children = [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return  # gone already, or no such file here: the group's kill follows
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def _kill_group(pid: int) -> None:
    # The run's session: the launcher (or unshare, whose --kill-child takes the whole PID
    # namespace down with it) and everything it started that stayed in the group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
