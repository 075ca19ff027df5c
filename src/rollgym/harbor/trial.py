"""One trial of a Harbor task, built so that what the agent leaves cannot write its reward (two
forgeries remain: ``docs/concepts/harbor.md``, "What remains forgeable").

    prepared image ──► agent container ──(agent acts)──► every process ended, snapshot
                                                              │
                            fresh verifier container ◄────────┘
                            /tests, /logs/verifier: removed, then tests/ copied in
                            /tests/test.sh run (verifier timeout) ──► reward files read

1. The agent's container is made from the task's prepared image (``image.prepare``: built, git
   history past HEAD removed). It holds no ``/tests`` and no ``/solution``: neither is ever
   copied into it. Its network is off unless ``task.toml`` allows it; its cpus, memory and disk
   are ``task.toml``'s.
2. At verify, every process in it is ended, and its filesystem is snapshotted. It is destroyed.
3. The verifier runs in a fresh container from that snapshot: no process of the agent's lives
   there. The task's ``tests/`` is copied to a path of a random name, ``/tests`` and
   ``/logs/verifier`` are removed (whatever the agent left there), the tests moved in, and
   ``test.sh`` runs as Harbor runs it (executed
   directly, output to ``/logs/verifier/test-stdout.txt``) within the verifier's timeout.
4. The reward files are read back (base64, behind a random marker) and parsed as Harbor does (``reward.py``); a verifier that
   times out or leaves nothing readable is a ``VerifierError``.
5. Before ``test.sh`` runs, the tools it relies on (shells, Python and its packages, pytest,
   startup files, every ``conftest.py``/``sitecustomize.py``/``.pth``) are fingerprinted and
   compared with the prepared image's: a difference marks the trial ``integrity_suspect`` with the paths.
   This flags; it does not prevent (see ``docs/concepts/harbor.md``: what remains forgeable).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from rollgym.containers.runtime import Container, Lease, Limits, Runtime, Spec
from rollgym.errors import SandboxError, VerifierError
from rollgym.harbor.manifest import changed_paths, manifest_script
from rollgym.harbor.reward import REWARD_JSON, REWARD_TXT, Rewards, parse_rewards
from rollgym.harbor.task import HarborTask

log = logging.getLogger("rollgym.harbor")

VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
TEST_STDOUT = f"{VERIFIER_DIR}/test-stdout.txt"
REWARD_FILE_MAX = 1 << 20
"""A reward file larger than this is no reward (a verifier does not write a megabyte for one)."""
STEP_TIMEOUT = 60.0
"""Seconds each container step (create, copy, snapshot, a setup command) may take."""
SUSPECT_SHOWN = 20


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
    """A task's image, ready for its trials: built, scrubbed, and the fingerprints of the verifier's
    tools in it."""

    task: HarborTask
    image: str
    manifest: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """What the verifier decided, and what it saw."""

    rewards: Rewards
    test_exit: int | None
    seconds: float
    suspect: list[str] = field(default_factory=list)
    """Verifier tools the agent changed, added or removed (the first ``SUSPECT_SHOWN``)."""

    def fields(self) -> dict[str, Any]:
        """The verify response's fields (numbers are metrics)."""
        out: dict[str, Any] = {
            "reward": self.rewards.reward,
            "verifier_seconds": round(self.seconds, 3),
            "integrity_suspect": 1.0 if self.suspect else 0.0,
            "harbor_rewards": self.rewards.values,
            "harbor_reward_file": self.rewards.source,
        }
        if self.test_exit is not None:
            out["test_exit_code"] = self.test_exit
        if self.suspect:
            out["harbor_suspect_paths"] = self.suspect
        return out


class Trial:
    """One rollout's containers: ``start`` the agent's, ``verify`` in a fresh one, ``close``."""

    def __init__(self, prepared: Prepared, runtime: Runtime, lease: Lease) -> None:
        self.prepared = prepared
        self.task = prepared.task
        self.runtime = runtime
        self.lease = lease
        self.agent: Container | None = None
        self._verifying: asyncio.Future[Verdict] | None = None

    def _spec(self, image: str, env: dict[str, str] | None = None) -> Spec:
        cfg = self.task.config.environment
        return Spec(
            image=image,
            limits=task_limits(self.task),
            lease=self.lease,
            workdir=cfg.workdir,
            env={**cfg.env, **(env or {})},
            labels={"rollgym.harbor.task": self.task.name[:120]},
        )

    async def start(self) -> Container:
        """The agent's container (no /tests, no /solution in it)."""
        self.agent = await self.runtime.create(
            self._spec(self.prepared.image), timeout=STEP_TIMEOUT
        )
        return self.agent

    async def verify(self) -> Verdict:
        """End the agent phase and run the verifier in a fresh container (once: a repeated or
        concurrent call answers the same verdict)."""
        if self._verifying is None:
            self._verifying = asyncio.ensure_future(self._verify_once())
        return await asyncio.shield(self._verifying)

    async def _verify_once(self) -> Verdict:
        agent = self.agent
        if agent is None:
            raise SandboxError(f"harbor task {self.task.name}: verify before the agent's container")
        await agent.stop_processes(timeout=STEP_TIMEOUT)
        snapshot = await agent.snapshot(timeout=STEP_TIMEOUT * 2)
        self.agent = None
        spec = self._spec(snapshot, self.task.config.verifier.env)
        try:
            _, verifier = await asyncio.gather(
                agent.destroy(), self.runtime.create(spec, timeout=STEP_TIMEOUT)
            )
            try:
                return await self._run_verifier(verifier)
            finally:
                await verifier.destroy()
        finally:
            await self._remove_snapshot(snapshot)

    async def _remove_snapshot(self, image: str) -> None:
        """The snapshot served its one verifier: remove it now, not when its lease ends (a
        long run would pile one up per trial). A failure is logged: the reaper removes it at
        the lease's end."""
        try:
            await self.runtime.remove_image(image, timeout=STEP_TIMEOUT)
        except SandboxError as exc:
            log.warning("harbor task %s: removing its snapshot %s failed: %s",
                        self.task.name, image[:12], exc)  # fmt: skip

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.destroy()
            self.agent = None

    async def _run_verifier(self, box: Container) -> Verdict:
        started = time.monotonic()
        # The tests go to a path of a random name first (the agent could not have prepared
        # it), then take /tests's place inside the one exec below.
        staged = f"/.rollgym-tests-{secrets.token_hex(8)}"
        await box.put(self.task.tests_dir, staged, timeout=STEP_TIMEOUT)
        # One exec (each costs podman a process start): the tools listed before the tests run,
        # then test.sh under its timeout, then the reward files, each marked on its own line.
        limit = self.task.config.verifier.timeout_sec
        mark = f"@@rollgym-{secrets.token_hex(8)}@@"
        script = verifier_script(
            limit, staged, with_manifest=bool(self.prepared.manifest), mark=mark
        )
        ran = await box.exec(
            ["sh", "-c", script],
            timeout=limit + STEP_TIMEOUT,
            max_output=64 << 20,
        )
        if ran.timed_out or ran.truncated:
            raise SandboxError(
                f"harbor task {self.task.name}: the verifier's run did not finish "
                f"(timed out: {ran.timed_out}, output cut: {ran.truncated})"
            )
        out = read_verifier_output(ran.stdout, mark)
        if out.test_exit == TIMEOUT_EXIT:
            raise VerifierError(
                f"harbor task {self.task.name}: tests/test.sh did not finish within the "
                f"verifier's {limit:g} s"
            )
        suspect = changed_paths(self.prepared.manifest, out.manifest) if out.manifest else []
        rewards = parse_rewards(out.files.get(REWARD_JSON), out.files.get(REWARD_TXT))
        return Verdict(rewards, out.test_exit, time.monotonic() - started, suspect[:SUSPECT_SHOWN])


TIMEOUT_EXIT = 137
"""``timeout -s KILL``'s exit status when it killed test.sh."""


def verifier_script(limit: float, staged: str, *, with_manifest: bool, mark: str) -> str:
    """The verifier's run as one shell script: /tests and /logs/verifier replaced (whatever the
    agent left there removed, the staged tests moved in), the manifest (before the tests: they
    may write bytecode), ``test.sh`` killed at ``limit`` seconds, then each reward file in
    base64; each part opened by a line starting with ``mark`` (random per run: no file name
    can forge one)."""
    _MARK = mark
    test = f"{TESTS_DIR}/test.sh"
    lines = [
        f"rm -rf {TESTS_DIR} {VERIFIER_DIR} && mkdir -p {VERIFIER_DIR} && mv {staged} {TESTS_DIR}"
        f" || {{ echo '{_MARK} setup-failed'; exit 0; }}"
    ]
    if with_manifest:
        lines += [f"echo '{_MARK} manifest'", manifest_script()]
    lines += [
        f"chmod +x {test}",
        f"timeout -s KILL {math.ceil(limit)} {test} > {TEST_STDOUT} 2>&1",
        f'echo "{_MARK} exit $?"',
    ]
    for path in (REWARD_JSON, REWARD_TXT):
        lines += [
            f"if [ -f {path} ]; then size=$(stat -c %s {path}); "
            f'if [ "$size" -le {REWARD_FILE_MAX} ]; then echo "{_MARK} file {path} '
            f'$(base64 -w0 {path})"; else echo "{_MARK} large {path} $size"; fi; fi'
        ]
    return "\n".join(lines) + "\n"


@dataclass
class VerifierOutput:
    test_exit: int | None = None
    manifest: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


def read_verifier_output(stdout: str, mark: str) -> VerifierOutput:
    _MARK = mark
    out = VerifierOutput()
    section = ""
    for line in stdout.splitlines():
        if not line.startswith(_MARK):
            if section == "manifest":
                digest, sep, path = line.partition("  ")
                if sep:
                    out.manifest[path] = digest
            continue
        words = line[len(_MARK) :].split()
        section = words[0] if words else ""
        if section == "exit" and len(words) == 2 and words[1].isdigit():
            out.test_exit = int(words[1])
        elif section == "file" and len(words) in (2, 3):
            out.files[words[1]] = base64.b64decode(words[2]) if len(words) == 3 else b""
        elif section == "setup-failed":
            raise SandboxError("replacing /tests and /logs/verifier in the verifier failed")
        elif section == "large":
            raise VerifierError(f"{words[1]} is {words[-1]} bytes: too large to be a reward")
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
