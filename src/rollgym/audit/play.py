"""Play the panel on one server: every probe of every row, in parallel under the server's limit.

    floor answers, probes (each ``repeats`` times), tool plans -> their leaked strings -> results

The answer probes are played once more after the tools were called (``after_tools``). A tool
plan is played twice over: once to read what the tools answer, then each string of those
outputs as the answer, in a session of its own with the same calls before it (a tool may keep
state the verifier reads).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rollgym.audit.panel import (
    Probe,
    after_tools,
    floor_answers,
    leaked_strings,
    outputs_together,
    panel,
    prompt_messages,
    references,
    row_tools,
)
from rollgym.audit.target import Outcome, Play, Player
from rollgym.audit.verdict import Finding, Result, findings, right, verdict


@dataclass(frozen=True)
class ServerAudit:
    """The audit of one server: its verdict, findings, the plays made and the seconds taken."""

    verdict: str
    findings: list[Finding]
    plays: int
    refused: int
    """Plays the server answered with a 4xx (an answer it would not score)."""
    skipped: int
    """Plays not sent: the server had timed out too often."""
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "findings": [f.to_dict() for f in self.findings],
            "plays": self.plays,
            "refused": self.refused,
            "skipped": self.skipped,
            "seconds": self.seconds,
        }


async def audit_server(env: Player, rows: list[dict[str, Any]]) -> ServerAudit:
    """Audit the server behind ``env`` on ``rows``."""
    started = time.monotonic()
    server_tools = await env.detect()
    rows = [await env.prepare(row) for row in rows]
    refs = [references(row) for row in rows]
    jobs = []
    for i, row in enumerate(rows):
        pool = [ref[0] for j, ref in enumerate(refs) if ref and j != i][:8]
        if refs[i]:
            # Its own too, as a list that holds the answer would; in the middle, so that a
            # verifier that reads the first or the last answer is not taken for one that
            # reads them all.
            pool.insert(len(pool) // 2, refs[i][0])
        probes = [Probe("floor", "plainly wrong", a) for a in floor_answers(row)]
        probes += panel(row, pool, [] if env.gym else row_tools(row) or server_tools)
        probes += after_tools(probes)
        jobs += [_probe(env, row, i, refs[i], p) for p in probes]
    done = await asyncio.gather(*jobs)
    results = [r for rs in done for r in rs]
    found = findings([r for r in results if r.reward is not None or r.crash])
    return ServerAudit(
        verdict=verdict(found, scored=sum(r.reward is not None for r in results)),
        findings=found,
        plays=len(results),
        refused=sum(r.refused for r in results),
        skipped=sum(r.reward is None and r.crash is None and not r.refused for r in results),
        seconds=round(time.monotonic() - started, 2),
    )


async def _probe(
    env: Player, row: dict[str, Any], index: int, refs: list[str], probe: Probe
) -> list[Result]:
    if probe.leak:
        return await _tool_plan(env, row, index, refs, probe)
    answers = [probe.answer] * probe.repeats + list(probe.reordered)
    plays = await asyncio.gather(*(_one(env, row, index, refs, probe, answer)
                                   for answer in answers))  # fmt: skip
    return list(plays)


async def _tool_plan(
    env: Player, row: dict[str, Any], index: int, refs: list[str], probe: Probe
) -> list[Result]:
    last = Play("/verify")
    first = await env.play(row, "", probe.calls, last=last)
    if first.reward is None:
        return [_result(probe, index, "", first, last, refs)]
    # A string the prompt holds is no leak (a tool that echoes its argument): only what the
    # tools revealed is tried.
    prompt = "\n".join(prompt_messages(row))
    answers = [a for a in leaked_strings(first.outputs) if a not in prompt]
    plays = [_one(env, row, index, refs, probe, a) for a in answers]
    together = outputs_together(probe, first.outputs, prompt)
    if together is not None:
        plays.append(_one(env, row, index, refs, together, together.answer))
    return list(await asyncio.gather(*plays))


async def _one(
    env: Player, row: dict[str, Any], index: int, refs: list[str], probe: Probe, answer: str
) -> Result:
    last = Play("/verify")
    outcome = await env.play(row, answer, probe.calls, last=last)
    return _result(probe, index, answer, outcome, last, refs)


def _result(
    probe: Probe, index: int, answer: str, outcome: Outcome, last: Play, refs: list[str]
) -> Result:
    request = {"endpoint": last.endpoint, "body": last.body} if last.body else None
    return Result(
        probe, index, answer, outcome.reward, outcome.crash, request,
        right(probe, answer, refs), refused=outcome.refused is not None,
    )  # fmt: skip
