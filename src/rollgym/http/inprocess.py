"""A transport that serves some servers from ASGI apps in this process, with no socket.

``inprocess://NAME`` URLs go to the app registered under NAME, called as an HTTP server would
call it (the same scope, body, headers and status), so the caller's retries, breakers, deadlines
and error bodies are exactly those of a real hop; every other URL goes to the ``fallback``
transport. It exists for the collector's in-process agent (``collect.agent_in_process``): the
``/run`` hop and its process go away, and nothing else changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from rollgym.http.translate import raise_translated
from rollgym.http.transport import JSON_HEADERS, RawAnswer, Request, Transport, cookie_pairs

SCHEME = "inprocess://"

Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]


def inprocess_url(name: str) -> str:
    """The URL of server ``name`` served in this process."""
    return f"{SCHEME}{name}"


class InProcessTransport:
    """``inprocess://NAME/path`` to ``apps[NAME]``; anything else to ``fallback``."""

    def __init__(self, apps: Mapping[str, ASGIApp], fallback: Transport) -> None:
        self.apps = dict(apps)
        self.fallback = fallback

    async def send(self, request: Request) -> RawAnswer:
        url = request.url
        if not url.startswith(SCHEME):
            return await self.fallback.send(request)
        name, _, path = url[len(SCHEME) :].partition("/")
        app = self.apps.get(name)
        try:
            if app is None:
                # As a socket would refuse: the caller's failover and records treat it alike.
                raise ConnectionRefusedError(111, f"no server {name!r} in this process")
            async with asyncio.timeout(max(request.timeout, 0.001)):
                return await _call(app, name, "/" + path, bytes(request.body), request.headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_translated(exc, request)

    async def close(self) -> None:
        close = getattr(self.fallback, "close", None)
        if close is not None:
            await close()


async def _call(
    app: ASGIApp, name: str, path: str, body: bytes, headers: Mapping[str, str] | None
) -> RawAnswer:
    """One POST through ``app``: what it answered, as the socket transport reports it."""
    sent = {**JSON_HEADERS, **headers} if headers else JSON_HEADERS
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in sent.items()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 0),
        "server": (name, 0),
    }
    delivered = False
    answered = asyncio.get_running_loop().create_future()

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        # The caller never goes away mid-request (a deadline cancels this whole call instead):
        # an app waiting for a disconnect hears of it once its answer is sent, as from a
        # server. Shielded: a waiter cancelled (its request done) must not cancel the others.
        await asyncio.shield(answered)
        return {"type": "http.disconnect"}

    status = 0
    answer_headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, answer_headers
        if message["type"] == "http.response.start":
            status = message["status"]
            answer_headers = list(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False) and not answered.done():
                answered.set_result(None)

    try:
        await app(scope, receive, send)
    finally:
        if not answered.done():
            answered.set_result(None)  # whoever still waits for a disconnect gets it
    if not status:
        raise ConnectionResetError(104, f"{name} ended the request without an answer")
    retry_after = None
    cookies: list[tuple[str, str]] = []
    for key, value in answer_headers:
        low = key.lower()
        if low == b"retry-after" and status >= 400:
            retry_after = value.decode("latin-1")
        elif low == b"set-cookie":
            cookies.extend(cookie_pairs(value.decode("latin-1")))
    return RawAnswer(status, b"".join(chunks), retry_after, tuple(cookies))
