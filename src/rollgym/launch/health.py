"""Waiting for started servers to answer ``GET /health``: the one health wait of the launchers.

A server is up when ``/health`` answers 200. The wait fails as soon as a process exits (no point
waiting out the deadline for a server that crashed) and otherwise at one deadline shared by the
whole group; either way the error names the server, its exit code or last probe, and its log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

from rollgym.errors import LaunchError
from rollgym.launch.process import ServerProcess

PROBE_TIMEOUT = 1.0
"""Seconds one probe may take: a server that is up answers ``/health`` in milliseconds."""

_POLL_S = 0.05


async def wait_healthy(servers: Sequence[ServerProcess], timeout: float) -> None:
    """Return once every started server in ``servers`` answers ``/health`` with 200; raise
    ``LaunchError`` when one exits first, or when some are not healthy after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = [s for s in servers if s.proc is not None]
    # trust_env off (the default, stated): a proxy from the environment must not see probes
    # to servers on this machine or this cluster.
    client_timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT)
    async with aiohttp.ClientSession(timeout=client_timeout, trust_env=False) as session:
        while True:
            probes = await asyncio.gather(*(probe(session, s.url) for s in pending))
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


async def probe(session: aiohttp.ClientSession, url: str) -> str | None:
    """None if ``url`` answers ``GET /health`` with 200; otherwise what happened instead."""
    try:
        async with session.get(url + "/health") as resp:
            return None if resp.status == 200 else f"/health answered {resp.status}"
    except TimeoutError:  # aiohttp's timeouts included: a server still starting, or stuck
        return f"/health did not answer within {PROBE_TIMEOUT:g}s"
    except aiohttp.ClientConnectorError as exc:
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    except aiohttp.ClientError as exc:
        return f"/health failed: {type(exc).__name__}: {exc}"


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
