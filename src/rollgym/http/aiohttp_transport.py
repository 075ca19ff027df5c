"""The transport of ``https`` and of URLs with credentials: aiohttp's, behind the seam.

``LeanTransport`` sends plain ``http://``; what it cannot send goes here, as its ``fallback``
(``rollgym.http.default.default_transport`` pairs them). Both report the same ``RawAnswer``
and fail with the same errors, translated in ``rollgym.http.translate``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson

import rollgym.http.limits as answer_limits
from rollgym.config import AnswerLimits
from rollgym.http.limits import DECODABLE, Caps, OverLimit
from rollgym.http.translate import raise_translated
from rollgym.http.transport import RawAnswer, Request

if TYPE_CHECKING:
    # Imported on first use: a server that never calls another one (most environments, the
    # scripted model) starts without aiohttp, a tenth of a second of its start-up.
    import aiohttp

# Only what ``rollgym.http.limits.decompress`` decodes (aiohttp would also offer br or zstd
# when their packages are installed, and its own decoding has no output limit).
_SENT_HEADERS = {"content-type": "application/json", "accept-encoding": "gzip, deflate"}


class AiohttpTransport:
    """The transport of ``https`` and of URLs with credentials: one pooled aiohttp session,
    created on first use. The answer limits of the attempt (``rollgym.http.limits``) are
    aiohttp's own header limits (``header_line_bytes``), then counted over the body as it
    arrives; bodies are decoded here, not by aiohttp, so that decoding stops at its limit too."""

    def __init__(
        self,
        *,
        limit: int = 8192,
        keepalive_timeout: float = 30.0,
        limits: AnswerLimits = answer_limits.DEFAULT_LIMITS,
    ) -> None:
        # keepalive_timeout stays below the servers' (uvicorn: 75 s, set by rollgym.server), so
        # the client drops an idle connection before the server closes it under our feet.
        self._limit = limit
        self._keepalive = keepalive_timeout
        self.limits = limits  # for attempts sent without a client's
        self._caps = Caps(limits)
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
                # Decoded by ``_read`` under the decompressed-size limit (aiohttp's decoder
                # would inflate each chunk whole, a bomb's 64 KiB into 64 MiB at once).
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def send(self, request: Request) -> RawAnswer:
        url, body, headers, timeout, connect_timeout, _, _, idle_timeout = request
        session = self._get_session()
        hdrs = {**_SENT_HEADERS, **headers} if headers else _SENT_HEADERS
        limits = answer_limits.current(self._caps)
        line = header_line_bytes(limits.header_bytes)
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
                    url, data=body, headers=hdrs, timeout=client_timeout,
                    max_headers=limits.headers, max_field_size=line, max_line_size=line,
                ) as resp:  # fmt: skip
                    status = resp.status
                    raw = await _read(resp, limits)
                    retry_after = resp.headers.get("Retry-After") if status >= 400 else None
                    cookies = (
                        tuple((k, m.value) for k, m in resp.cookies.items())
                        if "Set-Cookie" in resp.headers
                        else ()
                    )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_translated(_header_overflow(exc, limits) or exc, request)
        return RawAnswer(status, raw, retry_after, cookies)


def header_line_bytes(header_bytes: int) -> int:
    """aiohttp's limit on one header line (and on the status line) for a total of
    ``header_bytes``: an eighth of it, at least 1 KiB, at most all of it.

    aiohttp checks its limits per line, not over all headers, and the total is counted (by
    ``_read``) only once the headers are parsed: until then aiohttp may hold the status line and
    ``headers`` lines of this size. The limit of a line bounds that, at the defaults (100 lines
    within 64 KiB) to 800 KiB rather than the 6.4 MiB of lines each as long as the total. An
    eighth keeps a legitimate answer readable: 8 KiB at the defaults, aiohttp's own default and
    the usual limit of servers and proxies, room for a 4 KiB cookie (the most browsers keep).
    A longer line is refused as past ``header_bytes`` (raising it raises this limit too), where
    ``LeanTransport``, which counts every byte of the headers as it comes, reads it.
    """
    return min(header_bytes, max(1024, header_bytes // 8))


async def _read(resp: aiohttp.ClientResponse, limits: Caps) -> bytes:
    """The body of ``resp``, read as it arrives and decoded, within ``limits``."""
    status = resp.status
    head = sum(len(k) + len(v) for k, v in resp.raw_headers)
    if head > limits.header_bytes:
        raise OverLimit("header_bytes", limits.header_bytes, head, status)
    cap = limits.body_bytes
    declared = resp.content_length
    if declared is not None and declared > cap:
        raise OverLimit("body_bytes", cap, declared, status)
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > cap:
            raise OverLimit("body_bytes", cap, size, status)
        chunks.append(chunk)
    raw = b"".join(chunks)
    encoding = resp.headers.get("content-encoding", "").strip().lower().encode("latin-1")
    if encoding in DECODABLE:
        raw = answer_limits.decompress(raw, encoding, limits.decompressed_bytes, status)
    return raw


def _header_overflow(exc: Exception, limits: Caps) -> OverLimit | None:
    """aiohttp's parser refusing headers past the limits it was given, as ``OverLimit``."""
    import aiohttp

    if not isinstance(exc, aiohttp.ClientResponseError):
        return None
    text = str(exc.message)
    if "Too many headers" in text:
        return OverLimit("headers", limits.headers, limits.headers + 1)
    if "Got more than" in text:
        return OverLimit("header_bytes", limits.header_bytes, limits.header_bytes + 1)
    return None
