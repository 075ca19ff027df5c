"""Waiting for started servers to answer ``GET /health``: the one health wait of the launchers.

A server is up when ``/health`` answers 200. The wait fails as soon as a process exits (no point
waiting out the deadline for a server that crashed) or says its warm-up failed (``failed``), and
otherwise at one deadline shared by the whole group: the start-up bound for a server that does
not answer, the longer warm-up bound for one that answers it is warming up (``starting``: a
scoring pool spawning and warming its workers, which on a busy machine may take longer than the
start-up bound and is no fault). Either way the error names the server, its exit code or last
probe, and its log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NamedTuple

import orjson

from rollgym.errors import ConnectError, LaunchError, RollgymError
from rollgym.http import Request, Transport, default_transport
from rollgym.launch.process import ServerProcess
from rollgym.launch.timeouts import WARMUP_TIMEOUT
from rollgym.wire import HEALTH_FAILED, HEALTH_STARTING

PROBE_TIMEOUT = 1.0
"""Seconds one probe may take: a server that is up answers ``/health`` in milliseconds."""

_POLL_S = 0.02


class Probe(NamedTuple):
    """One ``/health`` probe: ``problem`` None when healthy, else what happened instead;
    ``warming`` whether the server answered it is warming up (None: it did not answer);
    ``failed`` whether it answered that its warm-up failed."""

    problem: str | None
    warming: bool | None = None
    failed: bool = False


async def wait_healthy(
    servers: Sequence[ServerProcess], timeout: float, warmup_timeout: float = WARMUP_TIMEOUT
) -> None:
    """Return once every started server in ``servers`` answers ``/health`` with 200; raise
    ``LaunchError`` when one exits first or says its warm-up failed, or when some are not
    healthy after ``timeout`` (``warmup_timeout`` for a server whose last answer said it is
    warming up)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    pending = [s for s in servers if s.proc is not None]
    warming: dict[int, bool] = {}  # id(server) -> its last answer said it is warming up
    # rollgym's own transport (POST /health, which every rollgym server answers): no proxy
    # from the environment sees probes to servers on this machine or this cluster, and the
    # launcher does not import aiohttp to wait.
    transport = default_transport(limit=256)
    try:
        while True:
            probes = await asyncio.gather(*(probe(transport, s.url) for s in pending))
            last = {id(s): result for s, result in zip(pending, probes, strict=True)}
            pending = [s for s in pending if last[id(s)].problem is not None]
            for server in pending:
                said = last[id(server)]
                if said.warming is not None:  # a probe that got no answer changes nothing
                    warming[id(server)] = said.warming
                code = server.exit_code()
                if code is not None:
                    raise LaunchError(
                        f"server {server.name} exited with code {code} while starting "
                        f"({server.describe()})" + server.log_tail(),
                        server=server.name,
                    )
                if said.failed:
                    raise LaunchError(
                        f"server {server.name} failed while starting ({server.describe()}: "
                        f"{said.problem})" + server.log_tail(),
                        server=server.name,
                    )
            if not pending:
                return
            waited = loop.time() - started
            late = [
                s
                for s in pending
                if waited >= (max(timeout, warmup_timeout) if warming.get(id(s)) else timeout)
            ]
            if late:
                bound = max(timeout, warmup_timeout) if warming.get(id(late[0])) else timeout
                problems = [last[id(s)].problem or "" for s in late]
                raise _not_healthy(late, problems, bound)
            await asyncio.sleep(_POLL_S)
    finally:
        await transport.close()


async def probe(transport: Transport, url: str) -> Probe:
    """What ``url``'s ``/health`` answers (``Probe``)."""
    try:
        answer = await transport.send(
            Request(url + "/health", b"{}", None, PROBE_TIMEOUT, PROBE_TIMEOUT, "health", "/health")
        )
    except ConnectError as exc:
        return Probe(f"cannot connect ({exc.message.rsplit(': ', 1)[-1]})")
    except RollgymError as exc:  # a server still starting, or stuck
        if exc.type == "read_timeout":
            return Probe(f"/health did not answer within {PROBE_TIMEOUT:g}s")
        return Probe(f"/health failed: {exc.message}")
    if answer.status == 200:
        return Probe(None, warming=False)
    try:
        said = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        said = None
    status = said.get("status") if isinstance(said, dict) else None
    if status == HEALTH_STARTING:
        what = said.get("starting") if isinstance(said, dict) else None
        return Probe(f"still warming up ({str(what or 'starting')[:300]})", warming=True)
    if status == HEALTH_FAILED:
        why = said.get("error") if isinstance(said, dict) else None
        return Probe(str(why or "its warm-up failed")[:2000], warming=False, failed=True)
    return Probe(f"/health answered {answer.status}", warming=False)


def _not_healthy(pending: list[ServerProcess], probes: list[str], timeout: float) -> LaunchError:
    first = pending[0]
    names = "; ".join(
        f"{s.name} ({s.describe()}: {result})" for s, result in zip(pending, probes, strict=True)
    )
    return LaunchError(
        f"server {first.name} not healthy after {timeout:g}s; still waiting for: {names}"
        + first.log_tail(),
        server=first.name,
    )
