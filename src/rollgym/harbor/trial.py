"""One trial of a Harbor task, built so that nothing the agent does decides its reward.

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
   there. ``/tests`` and ``/logs/verifier`` are removed first (whatever the agent left there),
   then the task's ``tests/`` is copied in, and ``test.sh`` runs as Harbor runs it (executed
   directly, output to ``/logs/verifier/test-stdout.txt``) within the verifier's timeout.
4. The reward files are copied out and read as Harbor reads them (``reward.py``); a verifier that
   times out or leaves nothing readable is a ``VerifierError``.
5. Before ``test.sh`` runs, the tools it relies on (shells, Python and its packages, pytest,
   startup files, every ``conftest.py``/``sitecustomize.py``/``.pth``) are hashed and compared
   with the prepared image's: a difference marks the trial ``integrity_suspect`` with the paths.
   This flags; it does not prevent (see ``docs/concepts/harbor.md``: what remains forgeable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollgym.containers.runtime import Container, Lease, Limits, Runtime, Spec
from rollgym.errors import SandboxError, VerifierError
from rollgym.harbor.manifest import changed_paths, read_manifest
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
    """A task's image, ready for its trials: built, scrubbed, and the hashes of the verifier's
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
        self._verdict: Verdict | None = None

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
        """End the agent phase and run the verifier in a fresh container (once: a repeated call
        answers the same verdict)."""
        if self._verdict is not None:
            return self._verdict
        agent = self.agent
        if agent is None:
            raise SandboxError(f"harbor task {self.task.name}: verify before the agent's container")
        await agent.stop_processes(timeout=STEP_TIMEOUT)
        snapshot = await agent.snapshot(timeout=STEP_TIMEOUT * 2)
        await agent.destroy()
        self.agent = None
        verifier = await self.runtime.create(
            self._spec(snapshot, self.task.config.verifier.env), timeout=STEP_TIMEOUT
        )
        try:
            self._verdict = await self._run_verifier(verifier)
        finally:
            await verifier.destroy()
        return self._verdict

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.destroy()
            self.agent = None

    async def _run_verifier(self, box: Container) -> Verdict:
        started = time.monotonic()
        setup = await box.exec(
            ["sh", "-c", f"rm -rf {TESTS_DIR} {VERIFIER_DIR} && mkdir -p {VERIFIER_DIR}"],
            timeout=STEP_TIMEOUT,
        )
        _check(setup.exit_code, f"harbor task {self.task.name}: clearing /tests and /logs", setup)
        await box.put(self.task.tests_dir, TESTS_DIR, timeout=STEP_TIMEOUT)
        suspect = await self._suspect(box)
        test = f"{TESTS_DIR}/test.sh"
        ran = await box.exec(
            ["sh", "-c", f"chmod +x {test} && {test} > {TEST_STDOUT} 2>&1"],
            timeout=self.task.config.verifier.timeout_sec,
        )
        if ran.timed_out:
            raise VerifierError(
                f"harbor task {self.task.name}: tests/test.sh did not finish within the "
                f"verifier's {self.task.config.verifier.timeout_sec:g} s"
            )
        rewards = parse_rewards(*await self._reward_files(box))
        return Verdict(rewards, ran.exit_code, time.monotonic() - started, suspect)

    async def _suspect(self, box: Container) -> list[str]:
        if not self.prepared.manifest:
            return []
        now = await read_manifest(box)
        return changed_paths(self.prepared.manifest, now)[:SUSPECT_SHOWN]

    async def _reward_files(self, box: Container) -> tuple[bytes | None, bytes | None]:
        """The bytes of reward.json and reward.txt (None: absent), each bounded."""
        sizes = await box.exec(
            ["sh", "-c", f"for f in {REWARD_JSON} {REWARD_TXT}; do "
             "if [ -f \"$f\" ]; then stat -c %s \"$f\"; else echo -; fi; done"],
            timeout=STEP_TIMEOUT,
        )  # fmt: skip
        _check(sizes.exit_code, f"harbor task {self.task.name}: reading the reward files", sizes)
        listed = sizes.stdout.split()
        if len(listed) != 2:
            raise SandboxError(f"harbor task {self.task.name}: reward files: {sizes.stdout!r:.200}")
        out: list[bytes | None] = []
        with tempfile.TemporaryDirectory(prefix="rollgym-harbor-") as tmp:
            for path, size in zip((REWARD_JSON, REWARD_TXT), listed, strict=True):
                if size == "-":
                    out.append(None)
                    continue
                if not size.isdigit() or int(size) > REWARD_FILE_MAX:
                    raise VerifierError(f"{path} is {size} bytes: too large to be a reward")
                local = Path(tmp) / Path(path).name
                await box.get(path, local, timeout=STEP_TIMEOUT)
                out.append(await asyncio.to_thread(local.read_bytes))
        return out[0], out[1]


def _check(code: int | None, what: str, result: Any) -> None:
    if code != 0:
        raise SandboxError(f"{what} failed (exit {code}): {str(result.stderr)[-300:]}")


@contextlib.asynccontextmanager
async def scratch(runtime: Runtime, spec: Spec) -> Any:
    """A container for one setup job, destroyed after it."""
    box = await runtime.create(spec, timeout=STEP_TIMEOUT)
    try:
        yield box
    finally:
        await box.destroy()
