"""NeMo Gym's session cookie, for test servers that behave like its environments."""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from typing import Any

import orjson
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send


class SignedSession:
    """Starlette's SessionMiddleware as NeMo Gym uses it (``itsdangerous`` is not installed
    here): ``scope["session"]`` from an HMAC-signed cookie named ``cookie`` (NeMo Gym names it
    ``<ServerClass>___<name>``), a fresh ``session_id`` when there is none, and the cookie set
    again on every answer. ``sent`` logs (path, the Cookie header) of every request."""

    def __init__(self, app: ASGIApp, cookie: str) -> None:
        self.app, self.cookie, self.key = app, cookie, cookie.encode()
        self.sent: list[tuple[str, str | None]] = []

    def _sign(self, data: bytes) -> str:
        payload = base64.urlsafe_b64encode(data).decode()
        return payload + "." + hmac.new(self.key, payload.encode(), hashlib.sha256).hexdigest()

    def _load(self, value: str) -> dict[str, Any]:
        payload, _, sig = value.rpartition(".")
        expected = hmac.new(self.key, payload.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(sig, expected):
            return {}
        loaded: dict[str, Any] = orjson.loads(base64.urlsafe_b64decode(payload))
        return loaded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        self.sent.append((scope["path"], request.headers.get("cookie")))
        cookie = request.cookies.get(self.cookie)
        session = self._load(cookie) if cookie else {}
        session.setdefault("session_id", str(uuid.uuid4()))
        scope["session"] = session

        async def send_with_cookie(message: Any) -> None:
            if message["type"] == "http.response.start":
                value = self._sign(orjson.dumps(scope["session"]))
                MutableHeaders(scope=message).append(
                    "set-cookie", f"{self.cookie}={value}; path=/; httponly"
                )
            await send(message)

        await self.app(scope, receive, send_with_cookie)
