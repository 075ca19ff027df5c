"""``CodeEnv``: the model's Python solution run against the row's tests in a sandbox.

Rows are NeMo Gym ``code_gen`` rows (``verifier_metadata.unit_tests``; see ``cases.py``). The
solution is the reply's last fenced code block. Reward: 1.0 when every test passes (the
default, ``scoring: all``) or the fraction passed (``scoring: fraction``), per row
(``verifier_metadata.scoring``) or for the server (option ``scoring``). A reply without code
scores 0 without running anything. A sandbox that cannot run at all fails the verify as
``SandboxError`` (500): a broken environment is never a reward of 0, nor a masked sample (a
failed rollout is tried again by ``--resume``; a masked one is final).

Each test is a separate sandboxed run (``sandbox.py``), at most ``parallel`` at a time across
all rollouts; the event loop only waits on child processes. Pass or fail is decided here from
what the run printed or reported, never by the run itself (``cases.py``, ``asserts.py``).

A sandbox whose runs hold their slots long past the wall limit is broken, not slow: ``/health``
then answers 503 saying so, and the process ends itself so that the launcher's watchdog starts
a fresh one (a wedged server that still said "ok" would take every later verify down with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any, Literal

from pydantic import Field

from rollgym.envs.code.cases import Case, extract_code, outcome, row_tests
from rollgym.envs.code.sandbox import Isolation, Limits, Sandbox, probe_isolation
from rollgym.envs.rows import mean_field
from rollgym.errors import SandboxError
from rollgym.prometheus.samples import GaugeSample, Sample
from rollgym.protocol import output_text
from rollgym.runtime import owns_process
from rollgym.server.resources import ResourcesServer, Session

log = logging.getLogger("rollgym.envs.code")


class CodeEnv(ResourcesServer):
    """Python solutions checked by running the row's unit tests under a sandbox's limits."""

    row_fields = frozenset({"verifier_metadata"})
    # verify reads the row's tests and the reply: nothing is kept per session
    reverify_mode = "stateless"

    class Options(ResourcesServer.Options):
        scoring: Literal["all", "fraction"] = "all"
        parallel: int = Field(default=2, ge=1, le=64, description="sandboxed runs at once")
        cpu_seconds: int = Field(default=2, ge=1, le=600)
        wall_seconds: float = Field(default=6.0, gt=0, le=3600)
        memory_mb: int = Field(default=512, ge=64)
        processes: int = Field(default=16, ge=1, le=4096)
        open_files: int = Field(default=64, ge=16)
        file_mb: int = Field(default=16, ge=1, description="the largest file a run may write")
        work_mb: int = Field(default=32, ge=1, description="all a run's files together")
        work_inodes: int = Field(default=4096, ge=16, description="files and dirs in the work dir")
        output_kb: int = Field(default=1024, ge=1)
        uid_base: int = Field(default=60000, ge=1000, description="first uid of the slots")
        require_namespaces: bool = Field(
            default=True,
            description="fail every verify if namespaces are unavailable (false: run with the "
            "weaker fallback, where a program can read the host's files)",
        )

    options: Options

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sandbox: Sandbox | None = None
        self._watch: asyncio.Task[None] | None = None
        self._runs = 0  # sandboxed runs asked for and not done: running or waiting for a slot

    async def startup(self) -> None:
        await super().startup()
        isolation = await asyncio.to_thread(probe_isolation)
        log.info("%s: sandbox isolation: %s", self.name, isolation.describe())
        if self.options.require_namespaces and not isolation.namespaces:
            log.error(
                "%s: unshare namespaces are unavailable here, and require_namespaces is on: "
                "every verify will fail (set require_namespaces: false to accept the weaker "
                "fallback; see the README)",
                self.name,
            )
        self._sandbox = self._make_sandbox(isolation)
        self._watch = asyncio.create_task(self._watch_wedge(self._sandbox))

    async def shutdown(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await super().shutdown()

    def health(self) -> dict[str, Any]:
        out = super().health()
        wedged = self._sandbox.wedged() if self._sandbox else None
        if wedged:
            out.update(status="unhealthy", reason=f"sandbox wedged: {wedged}")
        return out

    def exported(self) -> list[Sample]:
        """The sandbox's slots for ``/metrics`` (``rollgym.prometheus.samples.Exported``)."""
        sandbox = self._sandbox
        if sandbox is None:
            return []
        return [
            GaugeSample("sandbox_slots", "Sandbox slots (runs at once).", sandbox.parallel),
            GaugeSample("sandbox_slots_in_use", "Sandbox slots running a program now.",
                        sandbox.in_use),
            GaugeSample("sandbox_runs_waiting", "Sandboxed runs waiting for a free slot.",
                        max(0, self._runs - sandbox.in_use)),
        ]  # fmt: skip

    async def _watch_wedge(self, sandbox: Sandbox, every: float = 5.0) -> None:
        while True:
            await asyncio.sleep(every)
            wedged = sandbox.wedged()
            if wedged and owns_process():
                log.error("%s: sandbox wedged (%s): exiting so it is restarted", self.name, wedged)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def _make_sandbox(self, isolation: Isolation) -> Sandbox:
        o = self.options
        limits = Limits(
            cpu_seconds=o.cpu_seconds,
            wall_seconds=o.wall_seconds,
            memory_bytes=o.memory_mb * 2**20,
            processes=o.processes,
            open_files=o.open_files,
            file_bytes=o.file_mb * 2**20,
            output_bytes=o.output_kb * 1024,
            work_bytes=o.work_mb * 2**20,
            work_inodes=o.work_inodes,
        )
        return Sandbox(
            limits, parallel=o.parallel, uid_base=o.uid_base, isolation=isolation, server=self.name
        )

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        cases, tests, row_scoring = row_tests(task)
        scoring = row_scoring or self.options.scoring
        code = extract_code(output_text(response))
        if code is None:
            return _scored(scoring, [], len(cases), None)
        sandbox = self._sandbox
        if sandbox is None:  # served without startup (never by rollgym's app)
            sandbox = self._sandbox = self._make_sandbox(probe_isolation())
        if self.options.require_namespaces and not sandbox.isolation.namespaces:
            raise SandboxError(
                "unshare namespaces are unavailable here and require_namespaces is on (set it "
                "to false to run with the weaker fallback the README describes)",
                server=self.name,
            )
        spent: list[float] = []
        runs = [self._run(sandbox, code, c, tests.fn_name, spent) for c in cases]
        scored = _scored(scoring, await asyncio.gather(*runs), len(cases), code)
        # The sandbox time of this rollout: its runs' CPU seconds (``RunResult.cpu_s``).
        scored["sandbox_s"] = round(sum(spent), 4)
        return scored

    async def _run(
        self, sandbox: Sandbox, code: str, case: Case, fn_name: str | None, spent: list[float]
    ) -> tuple[str, str | None]:
        self._runs += 1
        try:
            run = await sandbox.run(
                code, case.stdin, mode=case.mode, fn_name=fn_name, probes=case.probes
            )
            spent.append(run.cpu_s)
        finally:
            self._runs -= 1
        # Off the event loop: a large report takes a while to judge, and the server's other
        # rollouts (and /health) must not wait for it.
        return await asyncio.to_thread(outcome, case, run)

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        return mean_field(rollouts, "tests_pass_rate", "tests_pass_rate")


def _scored(
    scoring: str, outcomes: list[tuple[str, str | None]], total: int, code: str | None
) -> dict[str, Any]:
    results = [status for status, _ in outcomes]
    passed = results.count("passed")
    fraction = passed / total if total else 0.0
    all_passed = 1.0 if total and passed == total else 0.0
    return {
        "reward": fraction if scoring == "fraction" else all_passed,
        "tests_passed": passed,
        "tests_total": total,
        "tests_pass_rate": fraction,
        "scores": {"tests": fraction, "all_tests": all_passed, "has_code": float(code is not None)},
        "test_results": results,
        "test_reasons": [why for _, why in outcomes],
        "extracted_model_code": code,
    }
