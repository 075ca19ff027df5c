"""The local container provider: podman's CLI, run as asyncio subprocesses.

- Every call has a deadline. At an exec's deadline both the podman client and the processes it
  started inside the container are killed: killing ``podman exec`` leaves what runs inside
  running, so each exec runs under ``timeout -s KILL`` inside (a backstop should this process
  die) and carries a marker in its environment by which its processes, daemons included, are
  found and killed at the deadline.
- Output is bounded: at most ``max_output`` bytes of each stream are kept, the rest is read and
  dropped, and the result says ``truncated``.
- A container's main process is ``sleep <seconds to its lease's deadline>``: it ends by itself
  at the deadline, and with it every process of the container (its pid namespace dies with its
  first process), even if no reaper ever runs. Its labels carry the lease (``lease.py``).
- No network unless ``Limits.network``; cpus, memory (no swap beyond it), pids and the rlimits
  (``nofile``, ``nproc``: this kernel refuses podman's defaults) are applied. ``disk_mb`` is
  enforced by the runtime's disk watchdog (``disk.py``: a container past it is killed and says
  ``disk_exceeded``); where the storage has project quotas (overlay on XFS ``pquota``) a quota
  a little above it is set too, so a burst cannot fill the host between two of its passes.
- podman's exit codes and stderr become rollgym errors in one place: ``translate``.

``crun`` refuses this machine's hybrid cgroups, so every call passes ``--runtime runc``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import json
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rollgym.containers import lease as leases
from rollgym.containers.disk import DiskWatch, Watched
from rollgym.containers.runtime import (
    CHANGES_MAX_BYTES,
    CHANGES_MAX_ENTRIES,
    ChangeSet,
    ExecResult,
    Spec,
)
from rollgym.errors import ContainerError, RollgymError

log = logging.getLogger(__name__)

_DISK_QUOTA: dict[str, bool] = {}
"""Per podman binary: can its storage cap a container's disk (``--storage-opt size=``)?"""
_QUOTA_WARNED: set[str] = set()

EXEC_MARK = "ROLLGYM_EXEC"
"""The environment variable that marks every process of one exec (its value is unique)."""
KILL_GRACE = 5.0
"""Seconds allowed to kill an exec's processes after its deadline, and for cleanup calls."""
NAME_PREFIX = "rollgym-"
LIST_ATTEMPTS = 4
EMPTIED_AFTER = 60.0
"""Seconds an image's storage must have been without its files before it is removed as
broken (a commit writes them within a moment of making the image's record)."""
_BROKEN_IMAGE = re.compile(
    r'image with ID \\?"([0-9a-f]{64})'
    r"|Image ([0-9a-f]{12,64}) exists in local storage but may be corrupted"
)
"""podman's words for an image a killed commit left broken: without its manifest (quoted
plainly, or escaped in a log line), or without its top layer ("layer not known", a short id)."""


@dataclass(frozen=True, slots=True)
class Completed:
    """One podman call: its exit code (None if killed at its deadline) and bounded output."""

    code: int | None
    stdout: bytes
    stderr: bytes
    seconds: float
    timed_out: bool
    truncated: bool


async def _read_bounded(stream: asyncio.StreamReader | None, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of ``stream``; the rest is read to the end and dropped, so the
    writer never blocks on a full pipe."""
    if stream is None:
        return b"", False
    kept = bytearray()
    cut = False
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        if len(chunk) > room:
            cut = True
            chunk = chunk[: max(room, 0)]
        kept += chunk
    return bytes(kept), cut


async def run(
    args: Sequence[str],
    *,
    timeout: float,
    max_output: int = 1 << 20,
    stdin: bytes | None = None,
) -> Completed:
    """Run ``args`` with a deadline and bounded output; at the deadline the process (and its
    process group) is killed and ``timed_out`` set. Never raises for the command's own exit."""
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        preexec_fn=die_with_parent,
        # conmon writes an empty ``oom`` file into its working directory when an exec's
        # process is OOM-killed: never into the caller's.
        cwd=tempfile.gettempdir(),
    )

    async def feed() -> None:
        if proc.stdin is None or stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()

    async def collect() -> tuple[tuple[bytes, bool], tuple[bytes, bool], None]:
        return await asyncio.gather(
            _read_bounded(proc.stdout, max_output), _read_bounded(proc.stderr, max_output), feed()
        )

    task = asyncio.ensure_future(collect())
    timed_out = False
    try:
        (out, cut_out), (err, cut_err), _ = await asyncio.wait_for(asyncio.shield(task), timeout)
        code: int | None = await asyncio.wait_for(proc.wait(), KILL_GRACE)
    except TimeoutError:
        timed_out = True
        _kill_group(proc)
        code = None
        try:
            (out, cut_out), (err, cut_err), _ = await asyncio.wait_for(task, KILL_GRACE)
        except (TimeoutError, asyncio.CancelledError):
            # A grandchild still holds the pipes open: keep nothing rather than wait on it.
            task.cancel()
            out, err, cut_out, cut_err = b"", b"", False, False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), KILL_GRACE)
    except BaseException:
        _kill_group(proc)
        task.cancel()
        raise
    return Completed(code, out, err, time.monotonic() - start, timed_out, cut_out or cut_err)


def die_with_parent() -> None:
    """In the child, before exec: be SIGKILLed when the process that started it dies (Linux's
    ``PR_SET_PDEATHSIG``). A collector killed mid-``podman run`` then leaves no client that
    goes on to make a container after the next start's reaper has looked."""
    if _PRCTL is not None:
        _PRCTL(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    _no_inherited_fds()


def _no_inherited_fds() -> None:
    """In the child, before exec: mark every descriptor past stdio close-on-exec. Under uvloop
    the child holds duplicates of its pipes that would survive the exec; podman hands them to
    ``conmon``, which keeps them open as long as the container runs, so a ``podman run -d``
    read to the end of its output would return only when the container exits."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 9)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def translate(verb: str, done: Completed, *, what: str = "") -> RollgymError:
    """The one place where a failed podman call becomes a rollgym error: its exit code as
    ``status``, its stderr as ``body``, the verb as ``endpoint``, and a message a person can
    act on for the failures that have a known cause."""
    stderr = done.stderr.decode("utf-8", errors="replace").strip()
    low = stderr.lower()
    subject = f"{what} " if what else ""
    retryable = False
    if done.timed_out:
        message = f"podman {verb} {subject}took longer than {done.seconds:.0f} s"
        retryable = True
    elif "no such container" in low or "no container with name or id" in low:
        message = f"container {subject}is gone (removed, or reaped past its lease)"
    elif "is not running" in low or "container state improper" in low:
        message = (
            f"container {subject}is not running (its processes were stopped, or its lease's "
            "deadline passed and its keep-alive ended)"
        )
    elif "image not known" in low or "no such image" in low:
        message = f"image {subject}is not in local storage (no registry is used: build it)"
    elif "cgroup" in low and "crun" in low:
        message = "podman's runtime refused this machine's cgroups: use runc (--runtime runc)"
    elif "no space left" in low:
        message = f"podman {verb} {subject}failed: no space left on the container storage"
        retryable = True
    else:
        first = stderr.splitlines()[-1] if stderr else "no message"
        message = f"podman {verb} {subject}failed (exit {done.code}): {first}"
    return ContainerError(
        message,
        status=done.code,
        body=stderr or None,
        server="podman",
        endpoint=verb,
        retryable=retryable,
    )


class PodmanRuntime:
    """Containers on the local podman (rootful, runc)."""

    name = "podman"

    def __init__(
        self,
        *,
        podman: str = "podman",
        oci_runtime: str = "runc",
        disk_watch: DiskWatch | None = None,
    ) -> None:
        self.podman = podman
        self.oci_runtime = oci_runtime
        self.disk = disk_watch or DiskWatch()
        # Learnt at the first container asking for one, once per process and podman (every
        # runtime of a run would otherwise pay a refused `podman run` and warn again).
        self._disk_quota: bool | None = _DISK_QUOTA.get(podman)
        self._graph_root: str | None = None
        self._repaired: list[str] = []  # corrupted images removed by ``list_leased``

    @staticmethod
    def available() -> bool:
        """Whether a podman binary is on PATH."""
        return shutil.which("podman") is not None

    def argv(self, *args: str) -> list[str]:
        return [self.podman, "--runtime", self.oci_runtime, *args]

    async def call(
        self,
        verb: str,
        *args: str,
        timeout: float,
        what: str = "",
        stdin: bytes | None = None,
        max_output: int = 1 << 20,
    ) -> Completed:
        """``podman <verb> <args>``; a failure (or the deadline) raises ``ContainerError``."""
        done = await run(
            self.argv(verb, *args), timeout=timeout, stdin=stdin, max_output=max_output
        )
        if done.timed_out or done.code != 0:
            raise translate(verb, done, what=what)
        return done

    def run_args(self, spec: Spec, name: str, *, quota: bool) -> list[str]:
        """``podman run``'s arguments for ``spec`` (the keep-alive is computed by ``create``)."""
        limits = spec.limits
        labels = {**spec.labels, **leases.to_labels(spec.lease)}
        args = ["-d", "--name", name, "--stop-timeout", "0", "--pull", "never"]
        args += ["--network", "slirp4netns" if limits.network else "none"]
        args += ["--cpus", f"{limits.cpus:g}"]
        args += ["--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m"]
        args += ["--pids-limit", str(limits.pids)]
        args += ["--ulimit", f"nofile={limits.nofile}:{limits.nofile}"]
        nproc = max(limits.pids, 512)
        args += ["--ulimit", f"nproc={nproc}:{nproc}"]
        args += ["--security-opt", "no-new-privileges", "--log-driver", "none"]
        if quota and limits.disk_mb:
            # Above the limit: the quota is the backstop against a burst between two passes of
            # the watchdog, which judges the limit itself (and flags what the quota would not).
            size = limits.disk_mb + max(16, limits.disk_mb // 8)
            args += ["--storage-opt", f"size={size}m"]
        if spec.workdir:
            args += ["--workdir", spec.workdir]
        for key, value in spec.env.items():
            args += ["--env", f"{key}={value}"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        for mount in spec.mounts:
            args += ["--volume", f"{os.path.realpath(mount.source)}:{mount.target}:ro"]
        return args

    async def create(self, spec: Spec, *, timeout: float) -> PodmanContainer:
        seconds = math.ceil(spec.lease.deadline - time.time())
        if seconds <= 0:
            raise ContainerError(
                f"lease of run {spec.lease.run!r} is past its deadline: no container started",
                server="podman",
                endpoint="run",
            )
        # The owner in the name too: a create killed midway leaves a container in storage only,
        # without its labels (``reap`` reads the name).
        name = f"{NAME_PREFIX}{leases.owner_token()}-{secrets.token_hex(4)}"
        quota = bool(spec.limits.disk_mb) and self._disk_quota is not False
        argv = self.run_args(spec, name, quota=quota)
        keepalive = ["--entrypoint", "sleep", spec.image, str(seconds)]
        try:
            done = await self.call("run", *argv, *keepalive, timeout=timeout, what=name)
        except ContainerError as exc:
            if quota and "overlay.size" in (exc.body or ""):
                self._disk_quota = _DISK_QUOTA[self.podman] = False
                if self.podman not in _QUOTA_WARNED:
                    _QUOTA_WARNED.add(self.podman)
                    log.warning(
                        "podman's storage here cannot cap a container's disk (overlay needs "
                        "XFS with project quotas): disk_mb is enforced by the disk watchdog alone"
                    )
                await self._remove_quietly(name)  # in case the refused run left it
                return await self.create(spec, timeout=timeout)
            # A run that timed out may still have made the container: it is named, so remove it.
            await self._remove_quietly(name)
            raise
        except BaseException:
            await self._remove_quietly(name)
            raise
        if quota:
            self._disk_quota = _DISK_QUOTA[self.podman] = True
        cid = done.stdout.decode().strip().splitlines()[-1]
        box = PodmanContainer(self, cid, name, spec)
        if spec.limits.disk_mb:
            try:
                await box._watch_disk(spec.limits.disk_mb)
            except BaseException:
                await self._remove_quietly(cid)
                raise
        return box

    async def remove_image(self, image: str, *, timeout: float) -> None:
        # No ``--force``: podman would remove the containers using the image with it. And
        # ``--no-prune``: else podman removes the image's untagged parents too (a snapshot's
        # parent is a prepared image, itself a snapshot, that every trial of its task uses).
        done = await run(self.argv("rmi", "--no-prune", image), timeout=timeout)
        if done.timed_out or (done.code != 0 and not _image_gone(done)):
            raise translate("rmi", done, what=image)

    async def _remove_quietly(self, name: str, *, timeout: float = KILL_GRACE * 2) -> None:
        with contextlib.suppress(Exception):
            await run(self.argv("rm", "-f", "-t", "0", name), timeout=timeout)

    async def list_leased(self, kind: str) -> list[tuple[str, dict[str, str]]]:
        """(id, labels) of every container (``kind="containers"``) or image (``"images"``)
        that carries a lease."""
        if kind == "containers":
            args = ["ps", "-a", "--filter", f"label={leases.MARK}", "--format", "json"]
        else:
            args = ["images", "-a", "--filter", f"label={leases.MARK}", "--format", "json"]
        done = await self._list_images(*args) if kind == "images" else None
        if done is None:
            done = await self.call(args[0], *args[1:], timeout=60)
        rows = json.loads(done.stdout or b"[]") or []
        return [(row["Id"], row.get("Labels") or {}) for row in rows]

    async def _list_images(self, *args: str) -> Completed:
        """``podman <args>`` (an image listing), first removing what a killed commit left.

        A ``podman commit`` SIGKILLed midway can leave an image without its manifest: a
        filtered listing then omits it (and says so on stderr), an unfiltered one fails on it,
        until it is removed. It is removed when its stored labels carry a lease that is over
        (an image of a commit still going on looks the same for a moment: its owner lives)."""
        for _ in range(LIST_ATTEMPTS):
            done = await run(self.argv(*args), timeout=60)
            repaired = 0
            found = _BROKEN_IMAGE.findall(done.stderr.decode("utf-8", "replace"))
            for short in {whole or part for whole, part in found}:
                image = await self._full_id(short)
                if image is None:
                    continue
                lease = leases.from_labels(await self._stored_labels(image))
                orphaned = lease is not None and bool(leases.orphan_reason(lease))
                if orphaned or (lease is None and await self._emptied(image)):
                    log.warning("removing image %s: left corrupted by a killed commit", image[:12])
                    await run(self.argv("rmi", "-f", image), timeout=60)
                    self._repaired.append(image)
                    repaired += 1
            if not repaired:
                break
        if done.timed_out or done.code != 0:
            raise translate(args[0], done)
        return done

    async def _full_id(self, short: str) -> str | None:
        """The one stored image whose id starts with ``short`` (None: none, or several)."""
        root = await self._root()
        found = await asyncio.to_thread(
            lambda: [p.name for p in Path(root, "overlay-images").glob(f"{short}*")]
        )
        return found[0] if len(found) == 1 and len(found[0]) == 64 else None

    async def _root(self) -> str:
        if self._graph_root is None:
            done = await self.call("info", "--format", "{{.Store.GraphRoot}}", timeout=30)
            self._graph_root = done.stdout.decode().strip()
        return self._graph_root

    async def _emptied(self, image: str) -> bool:
        """``image``'s stored files are gone (no manifest, no config: a removal cut short, as
        two reapers removing one broken image at once left it) and have been for a minute, so
        it is no commit under way: nobody can use it, and every listing fails on it."""
        where = Path(await self._root(), "overlay-images", image)

        def emptied() -> bool:
            try:
                names = os.listdir(where)
                age = time.time() - where.stat().st_mtime
            except OSError:  # no directory at all: not this case, left alone
                return False
            has_data = any(n == "manifest" or n.startswith("=") for n in names)
            return not has_data and age > EMPTIED_AFTER

        return await asyncio.to_thread(emptied)

    async def _stored_labels(self, image: str) -> dict[str, str]:
        """The labels in ``image``'s config as stored on disk (podman itself cannot read an
        image whose manifest is missing); empty when they cannot be read."""
        root = await self._root()
        key = base64.b64encode(f"sha256:{image}".encode()).decode()
        path = Path(root, "overlay-images", image, f"={key}")
        try:
            config = json.loads(await asyncio.to_thread(path.read_bytes))
            labels = config.get("config", {}).get("Labels") or {}
        except (OSError, ValueError, AttributeError):
            return {}
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}

    async def _storage_orphans(self) -> list[str]:
        """Containers podman only has in storage (a create or a build killed midway: no labels,
        not in ``ps -a``) whose name says their owner is gone."""
        done = await self.call("ps", "-a", "--external", "--format", "json", timeout=60)
        rows = json.loads(done.stdout or b"[]") or []
        return [
            row["Id"]
            for row in rows
            if str(row.get("State", "")).lower() == "storage"
            and any(leases.name_owner_gone(n) for n in row.get("Names") or [])
        ]

    async def _build_aliases(self) -> list[str]:
        """Tags a build made for its ``FROM`` (``images.build_task_image``) whose owner is
        gone."""
        done = await self._list_images(
            "images", "--filter", "reference=localhost/rollgym-build-*",
            "--format", "{{.Repository}}:{{.Tag}}",
        )  # fmt: skip
        refs = done.stdout.decode().split()
        return [r for r in refs if leases.name_owner_gone(r.removeprefix("localhost/"))]

    async def reap(self, *, now: float | None = None) -> list[str]:
        """Remove every leased container, then every leased image, whose owner is gone or whose
        deadline passed (containers first: an image in use cannot be removed); then what a
        killed create or build left in storage only, and a killed build's tags."""
        removed: list[str] = []
        storage = await self._storage_orphans()
        if storage:
            await run(self.argv("rm", "-f", *storage), timeout=120)
            removed += storage
        for kind, verb in (("containers", "rm"), ("images", "rmi")):
            doomed = []
            for ident, labels in await self.list_leased(kind):
                lease = leases.from_labels(labels)
                if lease is not None and leases.orphan_reason(lease, now=now):
                    doomed.append(ident)
            if not doomed:
                continue
            args = ["-f", "-t", "0"] if verb == "rm" else ["-f"]
            done = await run(self.argv(verb, *args, *doomed), timeout=120)
            if done.code not in (0, 1) and not done.timed_out:
                log.warning("podman %s of orphans: %s", verb, done.stderr[-500:])
            removed += doomed
        removed += self._repaired
        self._repaired = []
        aliases = await self._build_aliases()
        if aliases:
            await run(self.argv("rmi", *aliases), timeout=120)
            removed += aliases
        return removed


class PodmanContainer:
    """One podman container (see ``PodmanRuntime.create``)."""

    def __init__(self, runtime: PodmanRuntime, cid: str, name: str, spec: Spec) -> None:
        self.runtime = runtime
        self._id = cid
        self.name = name
        self.spec = spec
        self.disk: Watched | None = None
        """The disk watchdog's record of this container (None: no ``disk_mb``)."""

    @property
    def id(self) -> str:
        return self._id

    @property
    def disk_exceeded(self) -> bool:
        return self.disk is not None and self.disk.exceeded

    async def _watch_disk(self, limit_mb: int) -> None:
        """Hand what this container can write on the host's disk to the runtime's disk
        watchdog: its overlay upper dir, overlay's work dir (where a copy-up is made), and the
        directory of the files podman bind-mounts writable into it (``/etc/hosts``,
        ``/etc/hostname``, ``/run/.containerenv``: ``fallocate -l 40G /etc/hosts`` lands there,
        outside the layer). A layer that cannot be found is an error: a limit asked for and
        silently not kept is worse."""
        fields = (
            "{{.GraphDriver.Data.UpperDir}}\n{{.GraphDriver.Data.WorkDir}}\n"
            "{{.HostsPath}}\n{{.HostnamePath}}\n{{.ResolvConfPath}}"
        )
        done = await self.runtime.call(
            "inspect", "--format", fields, self._id, timeout=30, what=self.name
        )
        upper, work, *mounted = done.stdout.decode().split("\n")[:5] + [""] * 5
        if not upper.startswith("/"):
            raise ContainerError(
                f"disk_mb={limit_mb} cannot be kept for {self.name}: podman's storage driver "
                "shows no overlay upper dir to measure",
                server="podman",
                endpoint="inspect",
            )
        binds = sorted({os.path.dirname(p) for p in mounted if p.startswith("/")})
        paths = [p for p in (upper, work, *binds) if p]
        self.disk = self.runtime.disk.watch(self._id, paths, limit_mb, self._disk_kill)

    async def _disk_kill(self) -> None:
        """The watchdog's kill: the first process, and with it every process of the
        container (as ``stop_processes``). A failure raises (the watchdog tries again); a
        container already stopped or gone needs no kill."""
        done = await run(
            self.runtime.argv("kill", "--signal", "KILL", self._id), timeout=KILL_GRACE * 2
        )
        if done.timed_out or (done.code != 0 and not _already_stopped(done)):
            error = translate("kill", done, what=self.name)
            if "is gone" not in error.message:
                raise error

    def _disk_result(self, done: Completed | None = None) -> ExecResult:
        """An exec's outcome in a container the watchdog killed (``done``: what the exec
        printed before it)."""
        assert self.disk is not None
        out, err = (done.stdout, done.stderr) if done is not None else (b"", b"")
        note = self.disk.message
        return ExecResult(
            exit_code=None,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=(err.decode("utf-8", errors="replace") + "\n" + note).lstrip("\n"),
            seconds=done.seconds if done is not None else 0.0,
            truncated=done.truncated if done is not None else False,
            disk_exceeded=True,
        )

    async def exec(
        self,
        command: list[str] | str,
        *,
        timeout: float,
        max_output: int = 65536,
        stdin: bytes | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        if self.disk_exceeded:
            return self._disk_result()
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        mark = secrets.token_hex(8)
        args = ["exec", "--env", f"{EXEC_MARK}={mark}"]
        if stdin is not None:
            args.append("--interactive")
        if workdir:
            args += ["--workdir", workdir]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        # The backstop outlives our own deadline a little: it is for when this process is gone.
        backstop = f"{math.ceil(timeout) + 2}"
        args += [self._id, "timeout", "-s", "KILL", backstop, *argv]
        done = await run(
            self.runtime.argv(*args), timeout=timeout, max_output=max_output, stdin=stdin
        )
        # Marked before the kill: the kill ended this exec.
        if self.disk is not None and self.disk.exceeded:
            return self._disk_result(done)
        if done.timed_out:
            await self._kill_marked(mark)
        elif done.code in _PODMAN_CODES and _podman_failed(done) and not await self._running():
            raise translate("exec", done, what=self.name)
        return ExecResult(
            exit_code=None if done.timed_out else done.code,
            stdout=done.stdout.decode("utf-8", errors="replace"),
            stderr=done.stderr.decode("utf-8", errors="replace"),
            seconds=done.seconds,
            timed_out=done.timed_out,
            truncated=done.truncated,
        )

    async def _kill_marked(self, mark: str) -> None:
        """Kill every process in the container whose environment carries ``mark`` (twice over:
        a process may fork while the first pass runs)."""
        script = (
            "for i in 1 2; do for d in /proc/[0-9]*; do "
            f'grep -qasF \'{EXEC_MARK}={mark}\' "$d/environ" && kill -9 "${{d#/proc/}}"; '
            "done; done; true"
        )
        with contextlib.suppress(Exception):
            await run(self.runtime.argv("exec", self._id, "sh", "-c", script), timeout=KILL_GRACE)

    async def put(self, source: Path, dest: str, *, timeout: float) -> None:
        await self.runtime.call("cp", _host_path(source), f"{self._id}:{dest}", timeout=timeout)

    async def get(self, source: str, dest: Path, *, timeout: float) -> None:
        await self.runtime.call("cp", f"{self._id}:{source}", _host_path(dest), timeout=timeout)

    async def snapshot(self, *, timeout: float) -> str:
        """``podman commit`` of this container, labelled with its lease (so the reaper removes
        it with the run); returns the image id. Call it after ``stop_processes`` for one
        instant of the filesystem: a running container's files may change while copied."""
        changes: list[str] = []
        for key, value in leases.to_labels(self.spec.lease).items():
            changes += ["--change", f"LABEL {key}={shlex.quote(value)}"]
        done = await self.runtime.call(
            "commit", "--quiet", *changes, self._id, timeout=timeout, what=self.name
        )
        return done.stdout.decode().strip().splitlines()[-1]

    async def stop_processes(self, *, timeout: float) -> None:
        """Kill the container's first process: the kernel then kills every other process of
        its pid namespace, daemons and double forks included. The filesystem stays (``get``,
        ``snapshot`` still work); ``exec`` no longer does. Past a ``disk_mb``, the layer is
        measured once more here: a write just before the end is judged too."""
        done = await run(self.runtime.argv("kill", "--signal", "KILL", self._id), timeout=timeout)
        if done.timed_out or (done.code != 0 and not _already_stopped(done)):
            raise translate("kill", done, what=self.name)
        await self.runtime.call(
            "wait", "--condition", "stopped", self._id, timeout=timeout, what=self.name
        )
        if self.disk is not None:
            await self.runtime.disk.final_check(self._id)

    async def changes(
        self,
        *,
        timeout: float,
        drop: tuple[str, ...] = (),
        max_bytes: int = CHANGES_MAX_BYTES,
        max_entries: int = CHANGES_MAX_ENTRIES,
    ) -> ChangeSet:
        """The container's overlay upper directory, read on the host (``containers.changes``):
        nothing in the container runs. podman's own files (``/etc/hosts``, ``/etc/resolv.conf``,
        ``/etc/hostname``, ``/run/.containerenv``, mount points) are not changes of its
        programs and are skipped."""
        from rollgym.containers.changes import read_upper

        done = await self.runtime.call(
            "inspect", "--format", "{{json .GraphDriver}}", self._id, timeout=timeout,
            what=self.name,
        )  # fmt: skip
        driver = json.loads(done.stdout or b"{}") or {}
        upper = (driver.get("Data") or {}).get("UpperDir")
        if driver.get("Name") != "overlay" or not upper:
            raise ContainerError(
                f"container {self.name}: its storage driver is {driver.get('Name')!r}, not "
                "overlay: its changes cannot be read from the host",
                server="podman",
                endpoint="changes",
            )
        ignore = frozenset(PODMAN_FILES) | {m.target for m in self.spec.mounts}
        job = asyncio.to_thread(
            read_upper, Path(upper), drop=drop, ignore=ignore, max_bytes=max_bytes,
            max_entries=max_entries,
        )  # fmt: skip
        try:
            return await asyncio.wait_for(job, timeout)
        except TimeoutError:
            raise ContainerError(
                f"reading the changes of container {self.name} took longer than {timeout:.0f} s",
                server="podman",
                endpoint="changes",
                retryable=True,
            ) from None

    async def cpu_seconds(self) -> float | None:
        """CPU time of the container's processes, from its cgroup (``cpuacct.usage`` on
        cgroup v1 and hybrid hosts, ``cpu.stat``'s ``usage_usec`` on v2), found through its
        first process's ``/proc/<pid>/cgroup``. None when the container no longer runs (its
        cgroup goes with it) or the cgroup cannot be read."""
        try:
            done = await self.runtime.call(
                "inspect", "--format", "{{.State.Pid}}", self._id, timeout=30, what=self.name
            )
        except ContainerError:
            return None
        pid = done.stdout.decode().strip()
        if not pid.isdigit() or pid == "0":
            return None
        return await asyncio.to_thread(cgroup_cpu_seconds, int(pid))

    async def _running(self) -> bool:
        try:
            return await self.state() == "running"
        except ContainerError:
            return False

    async def state(self) -> str:
        """podman's state of this container (``running``, ``exited``, ...)."""
        done = await self.runtime.call(
            "inspect", "--format", "{{.State.Status}}", self._id, timeout=30, what=self.name
        )
        return done.stdout.decode().strip()

    async def destroy(self) -> None:
        self.runtime.disk.unwatch(self._id)
        # A layer of many files takes podman a while to delete (200,000: past 10 s, leaving the
        # container "Removing" until its lease's reaper): wait longer here.
        await self.runtime._remove_quietly(self._id, timeout=REMOVE_TIMEOUT)


REMOVE_TIMEOUT = 120.0
"""Seconds ``destroy`` waits for podman to remove a container and its layer."""
_PODMAN_CODES = (125, 126, 127, 255)
PODMAN_FILES = (
    "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/etc/mtab", "/run/.containerenv",
    "/run/secrets",
    "/proc", "/sys", "/dev",
)  # fmt: skip
"""Paths podman itself writes or mounts in a container: never its programs' changes."""
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_seconds(pid: int, root: Path = CGROUP_ROOT) -> float | None:
    """CPU seconds of the cgroup holding ``pid`` (its whole container), or None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # v1: "4:cpu,cpuacct:/path"; v2 (and hybrid's unified): "0::/path"
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            for folder in ("cpu,cpuacct", "cpuacct,cpu", "cpuacct"):
                usage = root / folder / path.lstrip("/") / "cpuacct.usage"
                with contextlib.suppress(OSError, ValueError):
                    return int(usage.read_text()) / 1e9
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            for base in (root, root / "unified"):
                with contextlib.suppress(OSError, ValueError):
                    for row in (base / path.lstrip("/") / "cpu.stat").read_text().splitlines():
                        key, _, value = row.partition(" ")
                        if key == "usage_usec":
                            return int(value) / 1e6
    return None


def _podman_failed(done: Completed) -> bool:
    """Whether an exec's exit may be podman's own failure, not the command's exit status: podman
    prefixes its messages with ``Error:``. The command may print the same, so the container's
    state decides (a command must not turn its own failure into the provider's)."""
    return done.stderr.lstrip().startswith(b"Error:")


def _image_gone(done: Completed) -> bool:
    low = done.stderr.lower()
    return b"image not known" in low or b"no such image" in low


def _already_stopped(done: Completed) -> bool:
    low = done.stderr.lower()
    return b"not running" in low or b"state improper" in low


def _host_path(path: Path) -> str:
    """``path`` made absolute: podman runs in another working directory (``run``)."""
    return os.path.abspath(path)
