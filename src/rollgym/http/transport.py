"""The seam where one attempt leaves the process: send a JSON body, get a raw answer back.

``HttpClient`` decides what to send, where, and whether to try again; a ``Transport`` only sends
one POST and reports what came back, so tests can drive every retry path through a fake one
with no sockets. ``AiohttpTransport`` is the real one: one pooled session, explicit limits and
timeouts, and aiohttp's errors turned into ours by ``rollgym.http.translate``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, NamedTuple, Protocol

import orjson

from rollgym.http.translate import raise_translated

if TYPE_CHECKING:
    # Imported on first use: a server that never calls another one (most environments, the
    # scripted model) starts without aiohttp, a tenth of a second of its start-up.
    import aiohttp

JSON_HEADERS = {"content-type": "application/json"}


class RawAnswer(NamedTuple):
    """What a server answered, any status: the body undecoded, ``Retry-After`` as sent."""

    status: int
    body: bytes
    retry_after: str | None = None
    cookies: tuple[tuple[str, str], ...] = ()
    """Cookies the answer set, as (name, value): a NeMo Gym environment keeps its session in
    one. Plain strings: they pickle, and nothing of aiohttp's leaves the transport."""


def cookie_pairs(header: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of one ``Set-Cookie`` header, as ``RawAnswer.cookies`` holds
    them; a header that does not parse sets none."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return []
    return [(name, morsel.value) for name, morsel in jar.items()]


class Transport(Protocol):
    """Sends one attempt. Raises a ``RollgymError`` naming ``server`` and ``endpoint`` when no
    answer came back (refused, reset, timed out); any answer, a 5xx included, is returned.
    ``timeout`` bounds the whole attempt; ``idle_timeout``, if given, every wait for more bytes
    (the answer's headers included): a streamed answer may take long, but never go silent."""

    async def send(
        self,
        url: str,
        body: bytes | bytearray,
        headers: Mapping[str, str] | None,
        *,
        timeout: float,
        connect_timeout: float,
        server: str,
        endpoint: str,
        idle_timeout: float | None = None,
    ) -> RawAnswer: ...


class AiohttpTransport:
    """The default transport: one pooled aiohttp session, created on first use."""

    def __init__(self, *, limit: int = 8192, keepalive_timeout: float = 30.0) -> None:
        # keepalive_timeout stays below the servers' (uvicorn: 75 s, set by rollgym.server), so
        # the client drops an idle connection before the server closes it under our feet.
        self._limit = limit
        self._keepalive = keepalive_timeout
        self._session: aiohttp.ClientSession | None = None
        # One ClientTimeout per (connect, idle) timeouts in use (a handful), not one per attempt.
        self._timeouts: dict[tuple[float, float | None], aiohttp.ClientTimeout] = {}

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            import aiohttp

            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=0,
                keepalive_timeout=self._keepalive,
                enable_cleanup_closed=True,
            )
            # No session-wide timeout: every request sets its own (aiohttp's default of 300 s
            # total is wrong both for minutes-long LLM calls and for fast tool calls).
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
                skip_auto_headers=("User-Agent",),
                # No shared cookie jar: one client serves every rollout, and a session cookie
                # set for one must never reach another's calls. Callers that need a server's
                # cookies get them from the answer (``HttpClient.call_with_cookies``).
                cookie_jar=aiohttp.DummyCookieJar(),
                # aiohttp always sends ``Accept-Encoding: gzip, deflate``, so a server behind
                # GZip middleware answers compressed: the body must be decompressed to be read.
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def send(
        self,
        url: str,
        body: bytes | bytearray,
        headers: Mapping[str, str] | None,
        *,
        timeout: float,
        connect_timeout: float,
        server: str,
        endpoint: str,
        idle_timeout: float | None = None,
    ) -> RawAnswer:
        session = self._get_session()
        hdrs = {**JSON_HEADERS, **headers} if headers else JSON_HEADERS
        client_timeout = self._timeouts.get((connect_timeout, idle_timeout))
        if client_timeout is None:
            import aiohttp

            # sock_read is aiohttp's idle timeout: its timer restarts whenever bytes arrive.
            client_timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=connect_timeout, sock_read=idle_timeout
            )
            self._timeouts[(connect_timeout, idle_timeout)] = client_timeout
        try:
            async with asyncio.timeout(max(timeout, 0.001)):
                async with session.post(
                    url, data=body, headers=hdrs, timeout=client_timeout
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
                    retry_after = resp.headers.get("Retry-After") if status >= 400 else None
                    cookies = (
                        tuple((k, m.value) for k, m in resp.cookies.items())
                        if "Set-Cookie" in resp.headers
                        else ()
                    )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_translated(
                exc, server=server, method="POST", url=url, endpoint=endpoint, timeout=timeout,
                idle_timeout=idle_timeout,
            )  # fmt: skip
        return RawAnswer(status, raw, retry_after, cookies)
