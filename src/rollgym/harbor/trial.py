"""One trial of a Harbor task, built so that nothing the agent leaves can write its reward.

    prepared image ──► agent container ──(agent acts)──► every process ended
                                                              │ its overlay upper dir, read
                                                              ▼ on the host: a ChangeSet
    prepared image ──► fresh verifier container  ◄── the changes outside the system trees
                       (+ busybox, tests, changes: one read-only mount of a random name)
                       /tests, /logs/verifier: replaced; /tests/test.sh run ──► reward files

1. The agent's container is made from the task's prepared image (``image.prepare``: built, git
   history past HEAD removed). It holds no ``/tests`` and no ``/solution``. Its network is off
   unless ``task.toml`` allows it; its cpus, memory and disk are ``task.toml``'s.
2. At verify its CPU time is read, every process in it is ended, and its changes are read on
   the host from its overlay (``Container.changes``: no program of the container takes part).
   It is destroyed. The changes are kept until ``close``: a verify cancelled or failed midway is
   tried again from them.
3. The verifier runs in a fresh container of the *prepared image*, on a lease of its own. Into it
   come the agent's changes except those to the system trees (``SYSTEM_TREES``: ``/usr``,
   ``/bin``, ``/lib*``, the dynamic loader's files, ...), which are dropped and reported
   (``harbor_system_changes_dropped``), and except ``/tests``, ``/logs/verifier``,
   ``/solution``. A task whose work is changing the system keeps them
   (``[metadata] rollgym_keep_system_changes = true``); they are then flagged.
4. The harness is a static busybox from the host, run by absolute path from a read-only mount
   of a random name: it restores the deletions, unpacks the changes, replaces ``/tests`` and
   ``/logs/verifier``, runs ``test.sh`` as Harbor does (directly, output to
   ``/logs/verifier/test-stdout.txt``, under busybox's ``timeout``) with a fixed ``PATH``, and
   prints the reward files in base64 behind a random mark. None of the agent's programs runs
   before ``test.sh``, and ``test.sh``'s interpreter and tools are the image's.
5. The reward is parsed as Harbor does (``reward.py``). A verification the agent broke (its
   changes past the bounds or not unpackable, ``test.sh`` ending 126/127, "cannot run a
   program", with no reward file) is reward 0 with ``harbor_verify_broken`` and the reason; an
   unreadable reward or a ``test.sh`` past the verifier's timeout stays a ``VerifierError``; a
   provider's failure a ``ContainerError``.
6. Changes that could still sway ``test.sh`` (startup files, ``conftest.py``, pytest's config and
   packages outside ``/usr``, programs in a ``bin`` directory) flag the trial
   ``integrity_suspect`` (``suspect.py``); ``docs/concepts/harbor.md`` says what remains.
7. Both containers' CPU seconds are summed into the verify's ``sandbox_s``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import os
import secrets
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollgym.containers.lease import new_lease
from rollgym.containers.runtime import (
    CHANGES_MAX_BYTES,
    CHANGES_MAX_ENTRIES,
    TOO_LARGE,
    ChangeSet,
    Container,
    Lease,
    Limits,
    Mount,
    Runtime,
    Spec,
)
from rollgym.errors import ContainerError, SandboxError, VerifierError
from rollgym.harbor.reward import REWARD_JSON, REWARD_TXT, Rewards, parse_rewards
from rollgym.harbor.suspect import suspect_paths
from rollgym.harbor.task import HarborTask

log = logging.getLogger("rollgym.harbor")

VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
TEST_STDOUT = f"{VERIFIER_DIR}/test-stdout.txt"
REWARD_FILE_MAX = 1 << 20
"""A reward file larger than this is no reward (a verifier does not write a megabyte for one)."""
STEP_TIMEOUT = 60.0
"""Seconds each container step (create, copy, reading the changes) may take."""
SUSPECT_SHOWN = 20
VERIFIER_MARGIN = 300.0
"""Seconds the verifier's lease outlives its timeout (its start, the harness's unpacking)."""
SYSTEM_TREES = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.cache",
    "/etc/alternatives", "/etc/python3*", "/etc/nsswitch.conf", "/etc/gitconfig",
    "/etc/pip.conf", "/etc/xdg", "/etc/ssl", "/etc/apt", "/etc/dpkg", "/etc/pam.d",
    "/etc/security",
)  # fmt: skip
"""What the verifier takes from the image only: its programs, libraries, the dynamic loader's
configuration, and (beyond the first list) ``/etc/alternatives`` (``/usr/bin/awk`` and friends
are links through it), ``/etc/python3.*`` (Debian's ``sitecustomize.py`` lives there),
``/etc/nsswitch.conf`` (it names the libraries glibc loads into every program that looks up a
user, bash at its start among them: a review's ``passwd: /x files`` loaded ``/app/libnss_/x.so.2``
into test.sh's shell) and ``/etc/gitconfig`` (``core.fsmonitor``, hooks and aliases run commands
in a test that calls git), and the configuration of the tools a ``test.sh`` commonly runs
before its tests (a review's ``/etc/pip.conf`` pointed ``pip install pytest`` at the agent's
wheel, and ``/etc/ssl/openssl.cnf`` loaded its library into ``curl``; ``apt``'s and ``dpkg``'s
hooks run commands; PAM's modules load into ``su``)."""
VERIFIER_OWNED = ("/tests", "/logs/verifier", "/solution")
"""Written by the verifier only: whatever the agent left there is never carried."""
CHANGE_BOUNDS = (CHANGES_MAX_BYTES, CHANGES_MAX_ENTRIES)
"""The bytes and paths of the agent's changes the verifier takes in; past them the trial pays 0,
flagged ``harbor_verify_broken``."""
TEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
"""Where Debian's ``busybox-static`` puts its binary on the host."""


def busybox() -> Path:
    """The host's static busybox (the verifier's harness), or a ``SandboxError`` saying how to
    install it."""
    for candidate in BUSYBOX_PATHS:
        if os.access(candidate, os.X_OK):
            return Path(os.path.realpath(candidate))
    raise SandboxError(
        "the Harbor verifier's harness needs a static busybox on this host: apt-get install "
        "busybox-static (scripts/install_containers.sh does)"
    )


def task_limits(task: HarborTask) -> Limits:
    """The container limits ``task.toml`` asks for (a default where it says nothing)."""
    env = task.config.environment
    return Limits(
        cpus=env.cpus or 1.0,
        memory_mb=env.memory_mb or 2048,
        disk_mb=env.storage_mb,
        network=env.network,
    )


@dataclass(frozen=True)
class Prepared:
    """A task's image, ready for its trials: built, and its git history past HEAD removed."""

    task: HarborTask
    image: str


@dataclass(frozen=True)
class Verdict:
    """What the verifier decided, and what it saw."""

    rewards: Rewards
    test_exit: int | None
    seconds: float
    suspect: list[str] = field(default_factory=list)
    """Changes that could sway the verifier (the first ``SUSPECT_SHOWN``)."""
    dropped: int = 0
    """The agent's changes to the system trees, not carried into the verifier."""
    dropped_shown: list[str] = field(default_factory=list)
    broken: str | None = None
    """Why the verification the agent's changes broke paid 0 (None: it ran)."""
    sandbox_s: float | None = None
    """CPU seconds of the agent's and the verifier's containers."""
    disk_exceeded: bool = False
    """The agent's container went past ``task.toml``'s ``storage_mb`` (the provider ended it)."""

    def fields(self) -> dict[str, Any]:
        """The verify response's fields (numbers are metrics)."""
        out: dict[str, Any] = {
            "reward": self.rewards.reward,
            "verifier_seconds": round(self.seconds, 3),
            "integrity_suspect": 1.0 if self.suspect else 0.0,
            "harbor_rewards": self.rewards.values,
            "harbor_reward_file": self.rewards.source,
            "harbor_system_changes_dropped": self.dropped,
            "harbor_verify_broken": 1.0 if self.broken else 0.0,
        }
        if self.test_exit is not None:
            out["test_exit_code"] = self.test_exit
        if self.suspect:
            out["harbor_suspect_paths"] = self.suspect
        if self.dropped_shown:
            out["harbor_system_changes_shown"] = self.dropped_shown
        if self.broken:
            out["harbor_verify_broken_reason"] = self.broken
        if self.sandbox_s is not None:
            out["sandbox_s"] = round(self.sandbox_s, 3)
        if self.disk_exceeded:
            out["disk_limit_exceeded"] = 1.0
        return out


class Trial:
    """One rollout's containers: ``start`` the agent's, ``verify`` in a fresh one, ``close``."""

    def __init__(self, prepared: Prepared, runtime: Runtime, lease: Lease) -> None:
        self.prepared = prepared
        self.task = prepared.task
        self.runtime = runtime
        self.lease = lease
        self.agent: Container | None = None
        self.changes: ChangeSet | None = None
        self.agent_cpu: float | None = None
        self._verdict: Verdict | None = None
        self._verifying: asyncio.Future[Verdict] | None = None

    def _spec(
        self, image: str, lease: Lease, env: dict[str, str] | None = None,
        mounts: tuple[Mount, ...] = (),
    ) -> Spec:  # fmt: skip
        cfg = self.task.config.environment
        return Spec(
            image=image,
            limits=task_limits(self.task),
            lease=lease,
            workdir=cfg.workdir,
            env={**cfg.env, **(env or {})},
            labels={"rollgym.harbor.task": self.task.name[:120]},
            mounts=mounts,
        )

    async def start(self) -> Container:
        """The agent's container (no /tests, no /solution in it)."""
        self.agent = await self.runtime.create(
            self._spec(self.prepared.image, self.lease), timeout=STEP_TIMEOUT
        )
        return self.agent

    async def verify(self) -> Verdict:
        """End the agent phase and run the verifier in a fresh container. A finished verdict is
        kept (a repeated call answers it); a run cancelled or failed is not: the next call runs
        the verifier again from the agent's kept changes. Concurrent calls share one run."""
        if self._verdict is not None:
            return self._verdict
        if self._verifying is None or self._verifying.done():
            self._verifying = asyncio.ensure_future(self._verify_once())
        return await asyncio.shield(self._verifying)

    async def _verify_once(self) -> Verdict:
        changes = await self._end_agent()
        verdict = await self._verify_from(changes)
        self._verdict = verdict
        return verdict

    def _drop(self) -> tuple[str, ...]:
        if self.task.keep_system_changes:
            return VERIFIER_OWNED
        return SYSTEM_TREES + VERIFIER_OWNED

    def _max_bytes(self) -> int:
        """The content the verifier takes in: never more than the task's disk (the watchdog
        charges a sparse file's blocks, the archive its whole size: a review's 1.5 GB sparse
        file passed one and overflowed the verifier's disk)."""
        storage = self.task.config.environment.storage_mb
        return min(CHANGE_BOUNDS[0], storage << 20) if storage else CHANGE_BOUNDS[0]

    async def _end_agent(self) -> ChangeSet | str:
        """The agent's changes, read once (kept until ``close``); a string: why they cannot be
        carried (the agent wrote past the bounds)."""
        if self.changes is not None:
            return self.changes
        agent = self.agent
        if agent is None:
            raise SandboxError(f"harbor task {self.task.name}: verify before the agent's container")
        self.agent_cpu = await agent.cpu_seconds() or self.agent_cpu
        await agent.stop_processes(timeout=STEP_TIMEOUT)
        if agent.disk_exceeded:
            # The provider ended it past storage_mb: it earns nothing, and what it wrote is
            # not read (past the bound by definition; the blocks go with the container).
            await self._destroy_agent()
            return DISK_EXCEEDED
        try:
            self.changes = await agent.changes(
                timeout=STEP_TIMEOUT * 2, drop=self._drop(), max_bytes=self._max_bytes(),
                max_entries=CHANGE_BOUNDS[1],
            )  # fmt: skip
        except ContainerError as exc:
            if exc.status != TOO_LARGE:
                raise
            await self._destroy_agent()
            return exc.message
        return self.changes

    async def _destroy_agent(self) -> None:
        agent, self.agent = self.agent, None
        if agent is not None:
            await agent.destroy()

    async def _verify_from(self, changes: ChangeSet | str) -> Verdict:
        started = time.monotonic()
        if isinstance(changes, str):
            return Verdict(_ZERO, None, 0.0, broken=changes, sandbox_s=self.agent_cpu,
                           disk_exceeded=changes == DISK_EXCEEDED)  # fmt: skip
        limit = self.task.config.verifier.timeout_sec
        lease = new_lease(self.lease.run, limit + VERIFIER_MARGIN)
        with tempfile.TemporaryDirectory(prefix="rollgym-verify-") as tmp:
            stage = await asyncio.to_thread(_stage, Path(tmp), self.task, changes)
            inside = f"/.rollgym-{secrets.token_hex(8)}"
            spec = self._spec(
                self.prepared.image, lease, self.task.config.verifier.env,
                mounts=(Mount(stage, inside),),
            )  # fmt: skip
            # The agent's container goes while the verifier's starts (its changes are read).
            _, box = await asyncio.gather(
                self._destroy_agent(), self.runtime.create(spec, timeout=STEP_TIMEOUT)
            )
            try:
                out = await self._run_harness(box, inside, limit)
                verifier_cpu = await box.cpu_seconds()
            finally:
                await box.destroy()
        cpu = [c for c in (self.agent_cpu, verifier_cpu) if c is not None]
        system = [p[1:] for p in changes.dropped if p[1:].startswith("/") and _system(p[1:])]
        carried = (
            tuple(p for p in changes.changed if _system(p)) if self.task.keep_system_changes
            else ()
        )  # fmt: skip
        # In a thread: it may read the archive (pytest configs), and the loop serves every
        # other session meanwhile.
        suspect = await asyncio.to_thread(
            suspect_paths, changes, carried_system=carried,
            workdir=start_dir(self.task),
        )  # fmt: skip
        common: dict[str, Any] = {
            "seconds": time.monotonic() - started,
            "suspect": [_printable(p) for p in suspect[:SUSPECT_SHOWN]],
            "dropped": len(system),
            "dropped_shown": [_printable(p) for p in system[:SUSPECT_SHOWN]],
            "sandbox_s": sum(cpu) if cpu else None,
        }
        if out.broken:
            return Verdict(_ZERO, out.test_exit, broken=out.broken, **common)
        try:
            if out.large:
                raise VerifierError(out.large)
            rewards = parse_rewards(out.files.get(REWARD_JSON), out.files.get(REWARD_TXT))
        except VerifierError as exc:
            # A program test.sh needs could not be run (126, 127) and nothing was written: the
            # harness and the system trees are the image's, so what is missing is what the
            # agent removed or broke. Any other unreadable reward stays the verifier's failure
            # (a task whose test.sh writes "one" is no agent's doing).
            if out.test_exit not in CANNOT_RUN or out.files:
                raise
            broken = f"{exc.message} (test.sh exit {out.test_exit})"
            return Verdict(_ZERO, out.test_exit, broken=broken, **common)
        return Verdict(rewards, out.test_exit, **common)

    async def _run_harness(self, box: Container, inside: str, limit: float) -> VerifierOutput:
        mark = f"@@rollgym-{secrets.token_hex(8)}@@"
        ran = await box.exec(
            [f"{inside}/busybox", "sh", "-c", verifier_script(limit, inside, mark=mark)],
            timeout=limit + STEP_TIMEOUT * 2,
            max_output=64 << 20,
        )
        if ran.disk_exceeded:
            # The verifier's own writes (test.sh's, beside the agent's unpacked changes) went
            # past storage_mb: the task's limit is too small for its verifier, no agent's doing.
            raise SandboxError(
                f"harbor task {self.task.name}: the verifier's container went past the task's "
                f"storage_mb ({self.task.config.environment.storage_mb} MB)"
            )
        if ran.timed_out or ran.truncated:
            raise SandboxError(
                f"harbor task {self.task.name}: the verifier's run did not finish "
                f"(timed out: {ran.timed_out}, output cut: {ran.truncated})"
            )
        out = read_verifier_output(ran.stdout, mark)
        if out.test_exit == TIMEOUT_EXIT:
            # Paid 0, flagged, not a failure: the usual cause is the agent's code the tests
            # run (a loop), and a failure would drop the rollout from training, so hanging
            # would beat a wrong answer. A task whose verifier is simply too slow shows as
            # harbor_verify_broken on every rollout.
            out.broken = f"tests/test.sh did not finish within the verifier's {limit:g} s"
        return out

    async def close(self) -> None:
        """Remove the agent's container (if still there) and the kept changes."""
        await self._destroy_agent()
        if self.changes is not None:
            self.changes.discard()
            self.changes = None


_ZERO = Rewards(0.0, {"reward": 0.0}, "none")
DISK_EXCEEDED = "the agent's container went past task.toml's storage_mb and was ended"


def _printable(path: str) -> str:
    """``path`` as text JSON can carry: a name's bytes that are not UTF-8 (the agent chose them)
    escaped, not a failure of the verify's answer."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _system(path: str) -> bool:
    from rollgym.containers.changes import is_dropped

    return is_dropped(path, SYSTEM_TREES)


def start_dir(task: HarborTask) -> str:
    """Where ``test.sh`` starts: ``task.toml``'s workdir, else the Dockerfile's last absolute
    ``WORKDIR`` (the image's), else ``/app`` (Harbor's convention)."""
    if task.config.environment.workdir:
        return task.config.environment.workdir
    found = "/app"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in task.dockerfile.read_text().splitlines():
            words = line.split()
            if len(words) == 2 and words[0].upper() == "WORKDIR" and words[1].startswith("/"):
                found = words[1]
    return found


def _stage(tmp: Path, task: HarborTask, changes: ChangeSet) -> Path:
    """The verifier's read-only mount, on the host: busybox, the tests, the changes' archive
    and the paths to delete (NUL-separated: a name may hold a newline)."""
    stage = tmp / "stage"
    stage.mkdir()
    shutil.copy2(busybox(), stage / "busybox")
    shutil.copytree(task.tests_dir, stage / "tests", symlinks=True)
    try:
        os.link(changes.archive, stage / "changes.tar")
    except OSError:
        shutil.copyfile(changes.archive, stage / "changes.tar")
    # Directories made again first, and no deletion below one: overlay makes a directory over
    # a path the image had as a link opaque, so removing it first (the link, not its target)
    # means no later path is resolved through a link of the image.
    opaque = tuple(f"{p}/" for p in changes.opaque)
    gone = [*changes.opaque, *(p for p in changes.deleted if not p.startswith(opaque))]
    # Then every file and link the archive brings: one may stand where the image has a
    # directory (the agent removed it and put a link or a file there: overlay needs no whiteout
    # for that), which tar cannot replace (a review's /etc/ssl made a link: an honest answer
    # paid 0 as broken). What the image has there goes; the archive's entry takes its place.
    with tarfile.open(changes.archive, "r") as tar:
        gone += [f"/{m.name}" for m in tar if not m.isdir()]
    (stage / "deleted").write_bytes(b"".join(os.fsencode(p) + b"\0" for p in gone))
    return stage


CANNOT_RUN = (126, 127)
"""A shell's exit status when a program could not be executed or found."""
TIMEOUT_EXIT = 137
"""``timeout -s KILL``'s exit status when it killed test.sh."""


def verifier_script(limit: float, inside: str, *, mark: str) -> str:
    """The verifier's run as one busybox shell script, every tool busybox's by absolute path:
    the agent's deletions restored and its changes unpacked (a failure: ``broken``), /tests and
    /logs/verifier replaced, ``test.sh`` killed at ``limit`` seconds, then each reward file in
    base64; each part opened by a line starting with ``mark`` (random per run: no file name
    can forge one)."""
    bb = f"{inside}/busybox"
    test = f"{TESTS_DIR}/test.sh"
    lines = [
        f"BB={bb}; S={inside}; M='{mark}'",
        "err=$($BB xargs -0 -r $BB rm -rf -- < $S/deleted 2>&1) "
        '|| { echo "$M broken deleting $(echo "$err" | $BB tail -c 300 | $BB base64 -w0)"; exit 0; }',
        "err=$($BB tar -xpf $S/changes.tar -C / 2>&1) "
        '|| { echo "$M broken unpacking $(echo "$err" | $BB tail -c 300 | $BB base64 -w0)"; exit 0; }',
        f"$BB rm -rf {TESTS_DIR} {VERIFIER_DIR}",
        # /logs whole, whatever the agent left: a /logs it made writable to all would let a
        # program of the agent's that test.sh runs unprivileged swap /logs/verifier.
        "$BB rm -rf /logs; umask 022",
        f"$BB mkdir -p {VERIFIER_DIR} && $BB cp -a $S/tests {TESTS_DIR} && $BB chmod +x {test}"
        ' || { echo "$M broken setup"; exit 0; }',
        f"PATH={TEST_PATH} $BB timeout -s KILL {math.ceil(limit)} {test} > {TEST_STDOUT} 2>&1",
        'echo "$M exit $?"',
    ]
    for path in (REWARD_JSON, REWARD_TXT):
        lines += [
            f"if [ -f {path} ]; then size=$($BB stat -L -c %s {path}); "
            f'if [ "$size" -le {REWARD_FILE_MAX} ]; then echo "$M file {path} '
            f'$($BB base64 -w0 {path})"; else echo "$M large {path} $size"; fi; fi'
        ]
    return "\n".join(lines) + "\n"


@dataclass
class VerifierOutput:
    test_exit: int | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    broken: str | None = None
    large: str | None = None


def read_verifier_output(stdout: str, mark: str) -> VerifierOutput:
    out = VerifierOutput()
    for line in stdout.splitlines():
        if not line.startswith(mark):
            continue
        words = line[len(mark) :].split()
        section = words[0] if words else ""
        if section == "exit" and len(words) == 2 and words[1].isdigit():
            out.test_exit = int(words[1])
        elif section == "file" and len(words) in (2, 3):
            out.files[words[1]] = base64.b64decode(words[2]) if len(words) == 3 else b""
        elif section == "broken" and len(words) >= 2:
            detail = base64.b64decode(words[2]).decode("utf-8", "replace") if len(words) > 2 else ""
            out.broken = f"the agent's changes could not be restored ({words[1]}): {detail}"
            return out
        elif section == "large":
            out.large = f"{words[1]} is {words[-1]} bytes: too large to be a reward"
    if out.test_exit is None:
        raise SandboxError("the verifier's run printed no exit status of tests/test.sh")
    return out


@contextlib.asynccontextmanager
async def scratch(runtime: Runtime, spec: Spec) -> Any:
    """A container for one setup job, destroyed after it."""
    box = await runtime.create(spec, timeout=STEP_TIMEOUT)
    try:
        yield box
    finally:
        await box.destroy()
