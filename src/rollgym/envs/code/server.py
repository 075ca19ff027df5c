"""``CodeEnv``: the model's Python solution run against the row's tests in a sandbox.

Rows are NeMo Gym ``code_gen`` rows (``verifier_metadata.unit_tests``; see ``cases.py``). The
solution is the reply's last fenced code block. Reward: 1.0 when every test passes (NeMo Gym's
rule, ``scoring: all``) or the fraction passed (``scoring: fraction``), per row
(``verifier_metadata.scoring``) or for the server (option ``scoring``). A reply without code
scores 0 without running anything. A sandbox that cannot run at all fails the verify as
``SandboxError`` (500): a broken environment is never a reward of 0.

Each test is a separate sandboxed run (``sandbox.py``), at most ``parallel`` at a time across
all rollouts; the event loop only waits on child processes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from pydantic import Field

from rollgym.envs.code.cases import Case, extract_code, outcome, row_tests
from rollgym.envs.code.sandbox import Isolation, Limits, Sandbox, probe_isolation
from rollgym.errors import SandboxError
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session

log = logging.getLogger("rollgym.envs.code")


class CodeEnv(ResourcesServer):
    """Python solutions checked by running the row's unit tests under a sandbox's limits."""

    row_fields = frozenset({"verifier_metadata"})

    class Options(ResourcesServer.Options):
        scoring: Literal["all", "fraction"] = "all"
        parallel: int = Field(default=2, ge=1, le=64, description="sandboxed runs at once")
        cpu_seconds: int = Field(default=2, ge=1, le=600)
        wall_seconds: float = Field(default=6.0, gt=0, le=3600)
        memory_mb: int = Field(default=512, ge=64)
        processes: int = Field(default=16, ge=1, le=4096)
        open_files: int = Field(default=64, ge=16)
        file_mb: int = Field(default=16, ge=1)
        output_kb: int = Field(default=1024, ge=1)
        uid_base: int = Field(default=60000, ge=1000, description="first uid of the slots")
        require_namespaces: bool = Field(
            default=False, description="fail every verify if namespaces are unavailable"
        )

    options: Options

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sandbox: Sandbox | None = None

    async def startup(self) -> None:
        await super().startup()
        isolation = await asyncio.to_thread(probe_isolation)
        log.info("%s: sandbox isolation: %s", self.name, isolation.describe())
        self._sandbox = self._make_sandbox(isolation)

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
                "require_namespaces is set, but unshare is unavailable here", server=self.name
            )
        results = await asyncio.gather(*(self._run(sandbox, code, c, tests.fn_name) for c in cases))
        return _scored(scoring, results, len(cases), code)

    async def _run(self, sandbox: Sandbox, code: str, case: Case, fn_name: str | None) -> str:
        run = await sandbox.run(
            code + case.program_suffix, case.stdin, mode=case.mode, fn_name=fn_name
        )
        return outcome(case, run)

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        rates = [
            r["tests_pass_rate"]
            for r in rollouts
            if isinstance(r.get("tests_pass_rate"), (int, float))
        ]
        return {"tests_pass_rate": sum(rates) / len(rates)} if rates else {}


def _scored(scoring: str, results: list[str], total: int, code: str | None) -> dict[str, Any]:
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
        "extracted_model_code": code,
    }
