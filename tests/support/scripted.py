"""Real servers on 127.0.0.1 that answer on a script, for the client's retry paths.

``Script`` is a small Starlette app served by uvicorn (``rollgym.testing.serve_asgi``): each
endpoint pops its next ``Reply`` from a list (or asks a function), and every hit is counted.
``RawScript`` is a bare asyncio server for what HTTP servers will not do on request: read the
whole request and then close the connection (FIN) or reset it (RST) without answering.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollgym.testing import serve_asgi


@dataclass
class Reply:
    """One scripted answer: a status, an optional body and headers, after ``delay`` seconds."""

    status: int = 200
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


Plan = list[Reply | int] | Callable[[int], Reply | int]


class Script:
    """Per-endpoint schedule of replies. ``hits[path]`` counts requests that reached the app."""

    def __init__(self, **plans: Plan) -> None:
        self.plans: dict[str, Plan] = {}
        self.defaults: dict[str, Reply] = {}
        self.hits: Counter[str] = Counter()
        self.release = asyncio.Event()
        for name, plan in plans.items():
            self.plan("/" + name.lstrip("/"), plan)

    def plan(self, path: str, plan: Plan, default: Reply | int | None = None) -> Script:
        self.plans[path] = plan
        if default is not None:
            self.defaults[path] = _reply(default)
        return self

    def _next(self, path: str, n: int) -> Reply:
        plan = self.plans.get(path)
        if callable(plan):
            return _reply(plan(n))
        if plan:
            return _reply(plan.pop(0))
        return self.defaults.get(path, Reply())

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        await request.body()
        self.hits[path] += 1
        n = self.hits[path]
        reply = self._next(path, n)
        if reply.delay:
            # Wait on an event rather than a bare sleep, so teardown can end a hanging handler
            # at once instead of waiting for uvicorn's graceful shutdown.
            with suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), reply.delay)
        body = reply.body
        if body is None:
            body = orjson.dumps({"ok": reply.status < 400, "hit": n, "path": path})
        return Response(
            body, status_code=reply.status, headers=reply.headers, media_type="application/json"
        )

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self.handle, methods=["POST"])])


def _reply(value: Reply | int) -> Reply:
    return value if isinstance(value, Reply) else Reply(value)


@asynccontextmanager
async def serve_script(script: Script) -> AsyncIterator[str]:
    async with serve_asgi(script.app()) as url:
        try:
            yield url
        finally:
            script.release.set()


class RawScript:
    """A bare TCP server: for each connection, read one whole HTTP request, then act on the
    next action of the script: ``"close"`` (FIN, no answer), ``"reset"`` (RST, no answer) or a
    status code (a minimal JSON answer). ``hits`` counts complete requests received."""

    def __init__(self, actions: list[str | int], default: str | int = 200) -> None:
        self.actions = list(actions)
        self.default = default
        self.hits = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        self.hits += 1
        action = self.actions.pop(0) if self.actions else self.default
        if action == "reset":
            sock = writer.get_extra_info("socket")
            # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        if action == "close":
            writer.close()
            return
        body = orjson.dumps({"ok": True, "hit": self.hits})
        writer.write(
            f"HTTP/1.1 {action} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()


@asynccontextmanager
async def serve_raw(script: RawScript) -> AsyncIterator[str]:
    server = await asyncio.start_server(script._handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()
