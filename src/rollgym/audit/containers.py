"""``rollgym audit TASKS_DIR``: a directory of container tasks (Harbor's format) audited with the
forging probes of ``rollgym.harbor.probes`` (each one an agent that tries to take the reward
without doing the task), reported as an audit of one server named after the directory.

A probe that should earn nothing and earns a reward on some task is a ``container_forge``
finding; a probe that plants what the verifier still takes (Python's startup files) and is not
flagged ``integrity_suspect`` is an ``unflagged_tamper`` one; a trial whose verifier failed (a
typed failure, no reward) is a ``crash``.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

from rollgym.audit.play import ServerAudit
from rollgym.audit.run import AuditReport
from rollgym.audit.verdict import Finding, verdict
from rollgym.containers.lease import new_lease
from rollgym.containers.podman import PodmanRuntime
from rollgym.harbor.image import prepare
from rollgym.harbor.probes import PROBES, ProbeResult, run_probes
from rollgym.harbor.task import load_tasks

PREPARED_LEASE = 3600.0


async def audit_task_directory(
    tasks_dir: Path, *, limit: int | None = None, concurrency: int = 4
) -> AuditReport:
    """Every probe on every task of ``tasks_dir`` (the first ``limit`` tasks if given)."""
    started = time.monotonic()
    tasks = load_tasks(tasks_dir)[:limit]
    runtime = PodmanRuntime()
    run = f"rollgym-audit-{Path(tasks_dir).name}"[:60]
    lease = new_lease(run, PREPARED_LEASE)
    prepared = await asyncio.gather(*(prepare(t, runtime, lease) for t in tasks))
    results = await run_probes(list(prepared), runtime, PROBES, concurrency=concurrency, run=run)
    audit = _server_audit(results, len(tasks), time.monotonic() - started)
    return AuditReport({Path(tasks_dir).name or "tasks": audit})


def _server_audit(results: list[ProbeResult], tasks: int, seconds: float) -> ServerAudit:
    by_probe: dict[str, list[ProbeResult]] = defaultdict(list)
    for r in results:
        by_probe[r.probe].append(r)
    findings = []
    for probe, rs in by_probe.items():
        crashed = [r for r in rs if r.reward is None]
        unsound = [r for r in rs if r.reward is not None and not r.sound]
        if unsound:
            cls = "unflagged_tamper" if unsound[0].expect == "flagged" else "container_forge"
            findings.append(_finding(cls, probe, rs, unsound))
        if crashed:
            findings.append(_finding("crash", probe, rs, crashed))
    scored = sum(1 for r in results if r.reward is not None)
    return ServerAudit(
        verdict=verdict(findings, scored), findings=findings, plays=len(results), refused=0,
        skipped=0, seconds=round(seconds, 2),
    )  # fmt: skip


def _finding(cls: str, probe: str, tried: list[ProbeResult], bad: list[ProbeResult]) -> Finding:
    rewards = [r.reward for r in tried if r.reward is not None]
    first = bad[0]
    return Finding(
        cls=cls, probe=probe, rows_tried=len(tried), rows_paid=len(bad),
        mean_reward=sum(rewards) / len(rewards) if rewards else None, mean_floor=0.0,
        example={"task": first.task, "reward": first.reward, "integrity_suspect": first.suspect,
                 "error": first.error},
    )  # fmt: skip
