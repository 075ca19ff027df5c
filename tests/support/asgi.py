"""One client, two transports: a rollgym server's app called in-process (an ASGI call, no
socket) or served for real (uvicorn on 127.0.0.1, aiohttp), so a test can hold both to the same
answers. Cookies are passed by hand per call, as NeMo Gym's clients pass them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import unquote

import aiohttp
import orjson
import yarl

from rollgym.config import ServerConfig
from rollgym.dialects import SERVER_DIALECTS
from rollgym.http import Target
from rollgym.server.app import App, build_app
from rollgym.server.base import BaseServer, ServerContext
from rollgym.testing import serve_asgi

TRANSPORTS = ("asgi", "socket")
TIMEOUT = aiohttp.ClientTimeout(total=20)


@dataclass
class Answer:
    status: int
    body: Any
    cookies: dict[str, str] = field(default_factory=dict)
    """The cookies this answer set (name -> value)."""
    set_cookie: list[str] = field(default_factory=list)
    """Its ``set-cookie`` headers as sent."""
    headers: dict[str, str] = field(default_factory=dict)
    """Its headers, names in lower case (the last of a repeated one)."""


def build(
    klass: type[BaseServer],
    name: str = "env",
    options: dict[str, Any] | None = None,
    peers: dict[str, Target] | None = None,
    dialects: tuple[Any, ...] = SERVER_DIALECTS,
) -> App:
    """``klass``'s app, built as ``serve_server`` builds it."""
    impl = f"{klass.__module__}:{klass.__name__}"
    cfg = ServerConfig.model_validate({"kind": klass.kind, "impl": impl, "options": options or {}})
    return build_app(klass(ServerContext(name, cfg, dict(peers or {}), dialects)))


class Client:
    """Calls to one app, in-process (``base`` None) or at ``base`` over a real socket. A path is
    the request target as sent (escaped already where it needs to be)."""

    def __init__(self, app: App, base: str | None, http: aiohttp.ClientSession | None) -> None:
        self.app, self.base, self.http = app, base, http

    @property
    def server(self) -> Any:
        return self.app.server

    async def post(
        self,
        path: str,
        body: Any = None,
        *,
        cookies: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        return await self.request("POST", path, body, cookies=cookies, headers=headers)

    async def get(self, path: str, *, headers: Mapping[str, str] | None = None) -> Answer:
        return await self.request("GET", path, headers=headers)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        cookies: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        sent = dict(headers or {})
        if cookies:
            sent["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        raw = b"" if body is None else orjson.dumps(body)
        if body is not None:
            sent["content-type"] = "application/json"
        if self.base is None:
            return await asgi_request(self.app, method, path, raw, sent)
        assert self.http is not None
        # As given: no dot segments resolved, no escapes added (a hostile path stays hostile).
        url = yarl.URL(self.base + path, encoded=True)
        async with self.http.request(method, url, data=raw or None, headers=sent) as resp:
            text = await resp.read()
            set_cookie = resp.headers.getall("set-cookie", [])
            heads = {k.lower(): v for k, v in resp.headers.items()}
            return Answer(resp.status, _json(text), _cookies(set_cookie), list(set_cookie), heads)


@asynccontextmanager
async def client(transport: str, app: App) -> AsyncIterator[Client]:
    """A ``Client`` of ``app`` over ``transport`` (one of ``TRANSPORTS``)."""
    if transport == "asgi":
        await app.server.startup()
        try:
            yield Client(app, None, None)
        finally:
            await app.server.shutdown()
        return
    jar = aiohttp.DummyCookieJar()  # cookies go by hand, per call
    async with (
        serve_asgi(app, name=app.server.name) as url,
        aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=jar) as http,
    ):
        yield Client(app, url, http)


async def asgi_request(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    scopes: list[dict[str, Any]] | None = None,
) -> Answer:
    """One HTTP request to ASGI ``app`` in this process: ``path`` is the request target as a
    client sends it (escapes decoded into the scope's ``path``, kept in ``raw_path``, as uvicorn
    does). ``scopes``: the scope sent is appended to it."""
    raw_path = path.encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(path),
        "raw_path": raw_path,
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    if scopes is not None:
        scopes.append(scope)
    done = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client stays until the answer is complete
        return {"type": "http.disconnect"}

    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    await app(scope, receive, send)
    done.set()
    raw_headers = [(k.decode().lower(), v.decode()) for k, v in start.get("headers", [])]
    set_cookie = [v for k, v in raw_headers if k == "set-cookie"]
    status, parsed = int(start["status"]), _json(b"".join(chunks))
    return Answer(status, parsed, _cookies(set_cookie), set_cookie, dict(raw_headers))


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")


def _cookies(headers: list[str]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for header in headers:
        jar.load(header)
    return {name: morsel.value for name, morsel in jar.items()}
