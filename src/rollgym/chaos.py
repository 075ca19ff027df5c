"""Fault injection: a reverse proxy that makes any server misbehave on a seeded schedule.

Off unless configured. Use it from a config (a server's ``chaos:`` section puts the proxy in
front of that server, and every caller is given the proxy's URL), from tests
(``async with chaos_proxy(url, spec)``), or from the command line (``rollgym chaos``).

Faults, each with a ``rate`` (fraction of requests) and optional ``paths``:

- ``status``: answer ``status`` (500/502/503/504/400/429...) with a rollgym error body;
  ``retry_after`` adds a ``Retry-After`` header.
- ``reset_before``: drop the connection without forwarding the request.
- ``reset_after``: forward the request (its side effects happen), then drop the connection.
- ``delay``: wait ``seconds`` and then forward; ``hang``: wait ``seconds`` (default 3600) and drop.
- ``malformed_json``: answer 200 with a body that is not JSON; ``truncated_json``: forward and
  answer with the first half of the real body.

``sequence: [503, 503, "ok"]`` scripts the first answers per path, in arrival order.
A rate-based decision is a hash of (seed, path, rollout id, how often that rollout hit that
path), so a rerun sees the same faults for the same rollouts whatever the arrival order.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import aiohttp
import orjson
from aiohttp import web

from rollgym.config import ChaosSpec, Fault
from rollgym.http.translate import translate
from rollgym.wire import HEADER_ROLLOUT

log = logging.getLogger("rollgym.chaos")


class ChaosProxy:
    """An aiohttp app forwarding to ``upstream`` and injecting the faults of ``spec``."""

    def __init__(self, upstream: str, spec: ChaosSpec, name: str = "chaos") -> None:
        self.upstream = upstream.rstrip("/")
        self.spec = spec
        self.name = name
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        self._seen: Counter[str] = Counter()
        self._sequence_pos: Counter[str] = Counter()
        self._arrivals = 0
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _decide(self, path: str, rollout: str | None) -> Fault | Literal["ok"] | int:
        # Health checks pass untouched: the launcher's waits and the model proxy's liveness
        # probes (POST /ping) are how a fault is found, not calls to inject faults into.
        if path in ("/health", "/ping") or (
            self.spec.paths is not None and path not in self.spec.paths
        ):
            return "ok"
        pos = self._sequence_pos[path]
        if pos < len(self.spec.sequence):
            self._sequence_pos[path] += 1
            return self.spec.sequence[pos]
        self._arrivals += 1
        key = rollout or f"#{self._arrivals}"
        self._seen[f"{path}|{key}"] += 1
        seed = f"{self.spec.seed}|{path}|{key}|{self._seen[f'{path}|{key}']}"
        u = int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "big") / 2**64
        edge = 0.0
        for fault in self.spec.faults:
            if fault.paths is not None and path not in fault.paths:
                continue
            edge += fault.rate
            if u < edge:
                return fault
        return "ok"

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, bytes, str]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            return resp.status, await resp.read(), resp.content_type

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # Decided on the headers alone, so reset_before can drop the connection before the
        # body is read.
        decision = self._decide(request.path, request.headers.get(HEADER_ROLLOUT))
        if isinstance(decision, int):
            decision = Fault(kind="status", status=decision)
        if isinstance(decision, Fault):
            self.injected[decision.kind if decision.kind != "status" else str(decision.status)] += 1
            early = await self._inject_before(request, decision)
            if early is not None:
                return early
        body = await request.read()
        try:
            status, raw, ctype = await self._forward(request, body)
        except aiohttp.ClientError as exc:
            err = translate(exc, server=self.name, method=request.method, url=self.upstream,
                            endpoint=request.path, timeout=0)  # fmt: skip
            return web.json_response({"error": {**err.to_dict(), "status": 502}}, status=502)
        self.forwarded += 1
        if isinstance(decision, Fault) and decision.kind == "reset_after":
            _drop(request)
            return web.Response(status=500)
        if isinstance(decision, Fault) and decision.kind == "truncated_json":
            return web.Response(
                body=raw[: len(raw) // 2], status=200, content_type="application/json"
            )
        return web.Response(body=raw, status=status, content_type=ctype or "application/json")

    async def _inject_before(self, request: web.Request, fault: Fault) -> web.StreamResponse | None:
        if fault.kind == "status":
            error = {
                "type": "chaos",
                "message": f"injected {fault.status} by the chaos proxy",
                "status": fault.status,
                "server": self.name,
            }  # no "retryable": a real failing server does not vouch either way
            headers = (
                {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else None
            )
            return web.json_response({"error": error}, status=fault.status, headers=headers)
        if fault.kind == "reset_before":
            _drop(request)
            return web.Response(status=500)
        if fault.kind == "hang":
            await asyncio.sleep(fault.seconds)
            _drop(request)
            return web.Response(status=500)
        if fault.kind == "delay":
            await asyncio.sleep(fault.seconds)
        if fault.kind == "malformed_json":
            return web.Response(body=b'{"output": [', status=200, content_type="application/json")
        return None

    def stats(self) -> dict[str, Any]:
        return {"forwarded": self.forwarded, "injected": dict(self.injected)}


_HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def _drop(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()  # RST, not a graceful close: the client sees a reset


@asynccontextmanager
async def chaos_proxy(
    upstream: str, spec: ChaosSpec | dict[str, Any], *, name: str = "chaos", port: int = 0
) -> AsyncIterator[tuple[str, ChaosProxy]]:
    """Run a chaos proxy in front of ``upstream`` in this event loop; yield (url, proxy)."""
    spec = spec if isinstance(spec, ChaosSpec) else ChaosSpec.model_validate(spec)
    proxy = ChaosProxy(upstream, spec, name)
    runner = web.AppRunner(proxy.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()  # OSError: the port is taken
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        yield url, proxy
    finally:
        await runner.cleanup()


def spec_json(spec: ChaosSpec) -> str:
    return orjson.dumps(spec.model_dump()).decode()
