"""Waiting for started servers to answer ``GET /health``: the one health wait of the launchers.

A server is up when ``/health`` answers 200. The wait fails as soon as a process exits (no point
waiting out the deadline for a server that crashed) and otherwise at one deadline shared by the
whole group; either way the error names the server, its exit code or last probe, and its log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rollgym.errors import ConnectError, LaunchError, RollgymError
from rollgym.http import Request, Transport, default_transport
from rollgym.launch.process import ServerProcess

PROBE_TIMEOUT = 1.0
"""Seconds one probe may take: a server that is up answers ``/health`` in milliseconds."""

_POLL_S = 0.02


async def wait_healthy(servers: Sequence[ServerProcess], timeout: float) -> None:
    """Return once every started server in ``servers`` answers ``/health`` with 200; raise
    ``LaunchError`` when one exits first, or when some are not healthy after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = [s for s in servers if s.proc is not None]
    # rollgym's own transport (POST /health, which every rollgym server answers): no proxy
    # from the environment sees probes to servers on this machine or this cluster, and the
    # launcher does not import aiohttp to wait.
    transport = default_transport(limit=256)
    try:
        while True:
            probes = await asyncio.gather(*(probe(transport, s.url) for s in pending))
            last = {id(s): result for s, result in zip(pending, probes, strict=True)}
            pending = [s for s in pending if last[id(s)] is not None]
            for server in pending:
                code = server.exit_code()
                if code is not None:
                    raise LaunchError(
                        f"server {server.name} exited with code {code} while starting "
                        f"({server.describe()})" + server.log_tail(),
                        server=server.name,
                    )
            if not pending:
                return
            if loop.time() >= deadline:
                raise _not_healthy(pending, [last[id(s)] or "" for s in pending], timeout)
            await asyncio.sleep(_POLL_S)
    finally:
        await transport.close()


async def probe(transport: Transport, url: str) -> str | None:
    """None if ``url`` answers ``/health`` with 200; otherwise what happened instead."""
    try:
        answer = await transport.send(
            Request(url + "/health", b"{}", None, PROBE_TIMEOUT, PROBE_TIMEOUT, "health", "/health")
        )
    except ConnectError as exc:
        return f"cannot connect ({exc.message.rsplit(': ', 1)[-1]})"
    except RollgymError as exc:  # a server still starting, or stuck
        if exc.type == "read_timeout":
            return f"/health did not answer within {PROBE_TIMEOUT:g}s"
        return f"/health failed: {exc.message}"
    return None if answer.status == 200 else f"/health answered {answer.status}"


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
