"""The default transport: a small HTTP/1.1 client for the hops of a rollout.

Every hop of a rollout is a JSON ``POST`` over plain HTTP to a server on this machine or this
cluster, answered in one go. For that, a keep-alive connection per request in flight and the C
parser of ``httptools`` (uvicorn's) are enough, at about a third of aiohttp's CPU per request
(measured: 27 against 85 µs per POST in the calling process). Anything else, an ``https://``
upstream or a URL carrying ``user:password@``, goes to the ``fallback`` transport it is given
(``rollgym.http.default.default_transport`` gives it aiohttp's, ``AiohttpTransport``); without
one, such a URL fails as a ``TransportError`` that is not retried. The two report the same
``RawAnswer`` and fail with the same errors, translated in ``rollgym.http.translate``.

What it does:

- a pool of idle connections per host and port, newest first; one closed by the server or idle
  past ``keepalive_timeout`` is never reused; at most ``limit`` connections open at once (more
  requests wait for one);
- ``Content-Length`` and chunked answers, and answers that end with the connection; ``gzip``
  and ``deflate`` bodies, though it asks for neither;
- ``connect_timeout`` for the connection, ``idle_timeout`` between received bytes (the answer's
  first byte included); the caller's whole-attempt ``timeout``;
- the answer limits of the attempt (``rollgym.http.limits``): header lines and their bytes,
  body bytes as they arrive (a declared ``Content-Length`` past the limit at once), decoded
  bytes; past one, reading stops and the connection closes (``OverLimit``);
- a request that does not finish (a timeout, a cancellation, a broken answer) closes its
  connection: a half-read answer must never be read as the next request's.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections import deque
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools
from httptools import HttpParserError, HttpParserUpgrade

import rollgym.http.limits as answer_limits
from rollgym.config import AnswerLimits
from rollgym.errors import TransportError
from rollgym.http.limits import DECODABLE, Caps, OverLimit
from rollgym.http.translate import raise_translated
from rollgym.http.transport import (
    AnswerCut,
    ConnectFailed,
    ConnectTimeout,
    IdleTimeout,
    RawAnswer,
    Request,
    Transport,
    cookie_pairs,
)

_BASE_HEADERS = b"content-type: application/json\r\n"


class _Answer:
    """What arrived of one answer (httptools' callbacks)."""

    __slots__ = (
        "body", "complete", "cookies", "declared", "encoding", "framed", "head_bytes",
        "head_lines", "head_unparsed", "headers_done", "keep_alive", "retry_after", "size",
        "status",
    )  # fmt: skip

    def __init__(self) -> None:
        self.framed = False  # a Content-Length or chunks say where the body ends
        self.declared: bytes | None = None  # the Content-Length, checked with the headers
        self.body: list[bytes] = []
        self.size = 0  # bytes of body so far
        self.head_lines = 0  # header lines parsed so far, and their bytes
        self.head_bytes = 0
        self.head_unparsed = 0  # bytes received while the headers were still incomplete
        self.cookies: list[str] = []
        self.retry_after: str | None = None
        self.encoding: bytes | None = None
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time.

    Built to be small while it waits: thousands wait at once in a collector, each for a whole
    rollout. The parser and the answer are made when the first bytes of an answer arrive and
    dropped when it is read; the request's deadline is an entry in the transport's ``_Clock``,
    not a timer of its own."""

    __slots__ = (
        "_idle_timeout", "_timer", "answer", "closed", "deadline_slot", "idle_since", "limits",
        "parser", "transport", "waiter",
    )  # fmt: skip

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.answer: _Answer | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.idle_since = 0.0
        self.deadline_slot = 0  # the _Clock slot of the request's deadline; 0: none
        self.limits = answer_limits.DEFAULT_CAPS  # of the request in flight
        self._idle_timeout: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if self.waiter is None or self.waiter.done():
            return
        answer = self.answer
        if answer is not None and answer.headers_done and not answer.framed and exc is None:
            # An answer without Content-Length or chunks ends with its connection.
            answer.complete = True
            self.waiter.set_result(None)
            return
        where = "mid-answer" if answer is not None and answer.headers_done else "before answering"
        self.waiter.set_exception(AnswerCut(104, f"the server closed the connection {where}"))

    def eof_received(self) -> bool | None:
        if self.waiter is None:
            self.closed = True  # the server closed an idle connection: never reuse it
        return None  # let the transport close; connection_lost ends any answer in progress

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:
            # Bytes nobody asked for, on an idle connection: it cannot be trusted with the next
            # request's answer.
            self.close()
            return
        if self._idle_timeout is not None:
            self._restart_timer()
        if self.parser is None:
            self.answer = _Answer()
            self.parser = httptools.HttpResponseParser(self)
        try:
            self.parser.feed_data(data)
        except HttpParserError as exc:
            # A limit raised in a callback reaches here as the parser's error, holding it.
            cause = exc.__context__
            self._fail(cause if isinstance(cause, OverLimit) else exc)
            return
        except HttpParserUpgrade as exc:
            # A 101 (Switching Protocols): the connection now speaks another protocol and no
            # answer will come on it (``translate`` makes it a ProtocolError). Not the parser's
            # error class: uncaught, asyncio logged it as a fatal error with a traceback.
            self._fail(exc)
            return
        answer = self.answer
        if answer is not None and not answer.headers_done:
            # Still in the headers: every byte of this read was header bytes (one header that
            # never ends is held by the parser until it does, so it is counted here).
            answer.head_unparsed += len(data)
            try:
                self._check_head(answer)
            except OverLimit as exc:
                self._fail(exc)

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.answer is not None and self.answer.complete:
            # A second answer to one request (even a bare status line): the connection is out
            # of step; it is closed (through the parser's error) and the first answer stands.
            raise HttpParserError("a second answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        answer = self.answer
        assert answer is not None
        # Counted here, compared once the headers are complete (``_check_head``): the parser
        # hands over one read at a time, so what it holds meanwhile is bounded by that read.
        answer.head_lines += 1
        answer.head_bytes += len(name) + len(value)
        name = name.lower()
        if name == b"set-cookie":
            answer.cookies.append(value.decode("latin-1"))
        elif name == b"retry-after":
            answer.retry_after = value.decode("latin-1")
        elif name == b"content-encoding":
            answer.encoding = value.strip().lower()
        elif name == b"content-length":
            answer.framed = True
            answer.declared = value
        elif name == b"transfer-encoding":
            answer.framed = True

    def on_headers_complete(self) -> None:
        answer = self.answer
        assert answer is not None and self.parser is not None
        answer.headers_done = True
        answer.status = self.parser.get_status_code()
        self._check_head(answer)
        # Declared past the limit: refused before a byte of it is read (the parser has checked
        # that it is digits).
        if answer.declared is not None and int(answer.declared) > self.limits.body_bytes:
            raise OverLimit("body_bytes", self.limits.body_bytes, int(answer.declared))

    def _check_head(self, answer: _Answer) -> None:
        limits = self.limits
        if answer.head_lines > limits.headers:
            raise OverLimit("headers", limits.headers, answer.head_lines)
        if answer.head_bytes > limits.header_bytes or answer.head_unparsed > limits.header_bytes:
            seen = max(answer.head_bytes, answer.head_unparsed)
            raise OverLimit("header_bytes", limits.header_bytes, seen)

    def on_body(self, body: bytes) -> None:
        answer = self.answer
        assert answer is not None
        answer.size += len(body)
        if answer.size > self.limits.body_bytes:
            # Chunks without end, or an answer read until close that never closes.
            raise OverLimit("body_bytes", self.limits.body_bytes, answer.size, answer.status)
        answer.body.append(body)

    def on_message_complete(self) -> None:
        assert self.answer is not None and self.parser is not None
        if self.answer.status < 200:
            self.answer = _Answer()  # 1xx (103 Early Hints...): the answer is still to come
            return
        # Read here: the parser forgets it once the message is over.
        self.answer.keep_alive = self.parser.should_keep_alive()
        self.answer.complete = True
        self._stop_timer()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # -- one request -------------------------------------------------------------------------

    def start(
        self,
        head: bytes,
        body: bytes | bytearray,
        idle_timeout: float | None,
        limits: Caps,
    ) -> asyncio.Future[None]:
        """Send a request; the future is done when its answer is (``answer_read`` reads it)."""
        assert self.transport is not None
        self.answer = None
        self.parser = None
        self.limits = limits
        self.waiter = asyncio.get_running_loop().create_future()
        self._idle_timeout = idle_timeout
        if idle_timeout is not None:
            self._restart_timer()
        # Two buffers, one write: the body is the caller's (a task row, kept for retries);
        # joining them would hold a second copy of it for as long as the answer takes. (uvloop
        # writes both as they are; asyncio's own transports join them, a passing copy.)
        self.transport.writelines((head, body))
        return self.waiter

    def answer_read(self) -> RawAnswer:
        """The answer of the request ``start`` sent, once ``waiter`` is done."""
        answer = self.answer
        assert answer is not None
        self.parser = None
        body = b"".join(answer.body)
        if answer.encoding in DECODABLE:
            # aiohttp decompressed these; a server may compress unasked. Never decoded past
            # the limit: a small bomb must not become a large body here.
            body = answer_limits.decompress(
                body, answer.encoding, self.limits.decompressed_bytes, answer.status
            )
        cookies: tuple[tuple[str, str], ...] = ()
        if answer.cookies:
            cookies = tuple(pair for header in answer.cookies for pair in cookie_pairs(header))
        status = answer.status
        return RawAnswer(status, body, answer.retry_after if status >= 400 else None, cookies)

    def end(self) -> bool:
        """The request is over (answered or not): no waiter, no timers, and nothing of the
        answer kept (an idle connection holding its last body would hold thousands of them
        once a run winds down). Whether the connection may carry another request."""
        answer = self.answer
        reusable = not self.closed and answer is not None and answer.complete and answer.keep_alive
        self.waiter = None
        self.answer = None
        self.parser = None
        self._stop_timer()
        return reusable

    def expire(self) -> None:
        """The request's deadline passed (the ``_Clock`` calls this). An answer already
        complete, its reader not yet resumed, stands, and so does the connection."""
        self.deadline_slot = 0
        if self.waiter is not None and not self.waiter.done():
            self._fail(TimeoutError())

    def usable(self, idle_since_at_least: float) -> bool:
        """Whether this idle connection may carry another request: open, not closing (the
        server's FIN may be read before ``connection_lost`` runs), not idle for too long."""
        return (
            not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
            and self.idle_since >= idle_since_at_least
        )

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def _restart_timer(self) -> None:
        self._stop_timer()
        assert self._idle_timeout is not None
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._idle_timeout, self._on_idle, self._idle_timeout)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_idle(self, seconds: float) -> None:
        self._timer = None
        self._fail(IdleTimeout(f"nothing received for {seconds:g}s"))


class _Clock:
    """The deadlines of the requests in flight, on one timer.

    A timer per request (``asyncio.timeout``) costs about 600 bytes with uvloop: a timer
    handle, a libuv timer, a context copy, a bound method. Thousands of rollouts in flight
    would each hold one for as long as the rollout takes. Here a deadline is an entry in the
    set of its ``TICK``-long slot, and one timer fires at the earliest slot: a request expires
    at most ``TICK`` late. A deadline past ``FOREVER`` (an infinite timeout) is no entry.

    One event loop at a time: a client taken to a new loop forgets the old loop's entries."""

    TICK = 0.005
    FOREVER = 1e12  # loop seconds (some 30,000 years): later deadlines are never reached

    __slots__ = ("_handle", "_heap", "_loop", "_slots", "_when")

    def __init__(self) -> None:
        self._slots: dict[int, set[_Connection]] = {}
        # Slot numbers, each once; those emptied since stay until they come due or the heap
        # is rebuilt (``remove`` keeps it under twice the slots in use).
        self._heap: list[int] = []
        self._handle: asyncio.TimerHandle | None = None
        self._when = 0  # the slot the timer is set for
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, conn: _Connection, when: float) -> None:
        """Expire ``conn``'s request at loop time ``when`` unless ``remove``d first."""
        if not when < self.FOREVER:
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None:
                # The old loop is gone or idle: its timer never fires here, and the entries
                # it left (requests dropped when it closed) are not this loop's to expire.
                self._slots.clear()
                self._heap.clear()
                self._handle = None
            self._loop = loop
        slot = math.ceil(when / self.TICK)
        conns = self._slots.get(slot)
        if conns is None:
            conns = self._slots[slot] = set()
            heapq.heappush(self._heap, slot)
            if self._handle is None or slot < self._when:
                self._arm(slot)
        conns.add(conn)
        conn.deadline_slot = slot

    def remove(self, conn: _Connection) -> None:
        slot = conn.deadline_slot
        if not slot:
            return  # expired, or never added
        conn.deadline_slot = 0
        conns = self._slots.get(slot)
        if conns is None:
            return
        conns.discard(conn)
        if conns:
            return
        del self._slots[slot]
        if not self._slots:
            # Nothing in flight: no timer left running, no heap of emptied slots kept.
            self._heap.clear()
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
        elif len(self._heap) > 2 * len(self._slots) + 64:
            # Requests end long before their deadlines: without this, the heap would hold a
            # slot number for every 5 ms of the last timeout's worth of traffic.
            self._heap = list(self._slots)
            heapq.heapify(self._heap)

    def _arm(self, slot: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        assert self._loop is not None
        self._when = slot
        self._handle = self._loop.call_at(slot * self.TICK, self._fire)

    def _fire(self) -> None:
        self._handle = None
        assert self._loop is not None
        # (The epsilon: a slot's time divided back by TICK may fall just short of it.)
        due = math.floor(self._loop.time() / self.TICK + 1e-6)
        heap = self._heap
        try:
            while heap and heap[0] <= due:
                conns = self._slots.pop(heapq.heappop(heap), None)
                for conn in conns or ():
                    conn.expire()
        finally:
            while heap and heap[0] not in self._slots:
                heapq.heappop(heap)  # emptied: every request of that slot ended in time
            if heap and self._handle is None:
                self._arm(heap[0])


class _Pool:
    """The connections to one server (host and port): idle ones newest last, how many are
    open, and the requests waiting for one at the limit."""

    __slots__ = ("host", "idle", "open", "port", "waiting")

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[_Connection] = []
        self.open = 0
        self.waiting: deque[asyncio.Future[None]] = deque()

    def closed_one(self) -> None:
        self.open -= 1
        self.wake()

    def wake(self) -> None:
        """A connection was freed (idle again, or closed): a waiting request may go."""
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class LeanTransport:
    """Plain-HTTP POSTs on pooled keep-alive connections; ``https`` and URLs with credentials
    through ``fallback`` (none: refused). ``limit``: connections open at once to one server
    (more requests to it wait for one; 0: no limit); ``keepalive_timeout``: seconds an idle
    connection is kept (below the servers' 75 s, so the client closes first).

    The limit is per server, not for all of them: an agent with thousands of rollouts in flight
    holds about as many connections to its model and to its environment, and a shared limit
    would close one's idle connections to open the other's, over and over."""

    def __init__(
        self,
        *,
        limit: int = 8192,
        keepalive_timeout: float = 30.0,
        limits: AnswerLimits = answer_limits.DEFAULT_LIMITS,
        fallback: Transport | None = None,
    ) -> None:
        self.limit = limit
        self.keepalive_timeout = keepalive_timeout
        self.limits = limits  # for attempts sent without a client's (``rollgym.http.limits``)
        self._caps = Caps(limits)
        self._pools: dict[tuple[str, int], _Pool] = {}
        self.fallback = fallback
        self._clock = _Clock()
        self._where: dict[str, tuple[_Pool, bytes] | None] = {}

    async def send(self, request: Request) -> RawAnswer:
        url, body, headers, timeout, connect_timeout, _, _, idle_timeout = request
        if url in self._where:
            where = self._where[url]
        else:
            where = self._where[url] = self._route(url)
        if where is None:
            if self.fallback is None:
                raise TransportError(
                    f"cannot send to {request.server}: the lean transport sends plain "
                    "http:// without credentials, and it was given no fallback transport "
                    "(rollgym.http.default_transport() has aiohttp's)",
                    retryable=False, server=request.server, method="POST", url=url,
                    endpoint=request.endpoint,
                )  # fmt: skip
            return await self.fallback.send(request)
        pool, head = where
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.001)
        try:
            lines = head + _header_lines(headers) + b"content-length: %d\r\n\r\n" % len(body)
            conn = self._take_idle(pool)
            if conn is None:
                async with asyncio.timeout_at(deadline):
                    conn = await self._connection(pool, connect_timeout)
            done = False
            try:
                self._clock.add(conn, deadline)  # before sending: nothing fails after it
                waiter = conn.start(lines, body, idle_timeout, answer_limits.current(self._caps))
                del lines  # per request: not to be held while the answer is awaited
                await waiter
                answer = conn.answer_read()
                done = True
            finally:
                self._clock.remove(conn)
                reusable = conn.end()  # always: it clears the request's state
                self._release(pool, conn, reusable and done)
            return answer
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_translated(exc, request)

    def _route(self, url: str) -> tuple[_Pool, bytes] | None:
        if len(self._where) > 4096:  # URLs are few (servers x endpoints); stay bounded
            self._where.clear()
        plain = _plain_http(url)
        if plain is None:
            return None
        host, port, head = plain
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _Pool(host, port)
        return pool, head

    async def _connection(self, pool: _Pool, connect_timeout: float) -> _Connection:
        """An idle connection of ``pool``, else a new one; at the limit, wait for one."""
        while True:
            conn = self._take_idle(pool)
            if conn is not None:
                return conn
            if self.limit <= 0 or pool.open < self.limit:
                break
            waiter = asyncio.get_running_loop().create_future()
            pool.waiting.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    pool.wake()  # woken, then cancelled: the turn goes to the next waiter
                else:
                    waiter.cancel()
                raise
        pool.open += 1
        try:
            async with asyncio.timeout(connect_timeout):
                loop = asyncio.get_running_loop()
                _, conn = await loop.create_connection(_Connection, pool.host, pool.port)
        except TimeoutError:
            pool.closed_one()
            raise ConnectTimeout(
                f"no connection to {pool.host}:{pool.port} in {connect_timeout:g}s"
            ) from None
        except OSError as exc:
            pool.closed_one()
            raise ConnectFailed(pool.host, pool.port, exc) from exc
        except BaseException:
            pool.closed_one()
            raise
        return conn

    def _take_idle(self, pool: _Pool) -> _Connection | None:
        """The newest usable idle connection of ``pool`` (closing the stale ones it passes)."""
        idle = pool.idle
        if idle:
            oldest_ok = time.monotonic() - self.keepalive_timeout
            while idle:
                conn = idle.pop()
                if conn.usable(oldest_ok):
                    return conn
                self._close(pool, conn)
        return None

    def _release(self, pool: _Pool, conn: _Connection, reusable: bool) -> None:
        if reusable:
            conn.idle_since = time.monotonic()
            pool.idle.append(conn)
            pool.wake()
        else:
            self._close(pool, conn)

    @staticmethod
    def _close(pool: _Pool, conn: _Connection) -> None:
        conn.close()
        pool.closed_one()

    async def close(self) -> None:
        """Close the idle connections; those in use close when their request ends."""
        for pool in self._pools.values():
            while pool.idle:
                self._close(pool, pool.idle.pop())
        close = getattr(self.fallback, "close", None)
        if close is not None:
            await close()


def _plain_http(url: str) -> tuple[str, int, bytes] | None:
    """(host, port, request line and fixed headers) of a plain ``http://`` URL; None for what
    aiohttp must send (``https``, credentials, anything this parser is not sure of)."""
    if not url.isascii():
        return None  # aiohttp percent-encodes what this client would send raw
    try:
        parts = urlsplit(url)
        port = 80 if parts.port is None else parts.port
    except ValueError:
        return None
    host = parts.hostname
    if parts.scheme != "http" or not host or parts.username is not None or parts.fragment:
        return None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in path for c in " \r\n") or ":" in host:  # IPv6 literals: aiohttp's
        return None
    authority = host if port == 80 else f"{host}:{port}"
    head = f"POST {path} HTTP/1.1\r\nhost: {authority}\r\n".encode("latin-1") + _BASE_HEADERS
    return host, port, head


def _header_lines(headers: Mapping[str, str] | None) -> bytes:
    if not headers:
        return b""
    lines = []
    for name, value in headers.items():
        if name.lower() in ("content-type", "host", "content-length"):
            continue  # set by this client, once each
        line = f"{name}: {value}\r\n"
        if any(c in line[:-2] for c in "\r\n\0"):
            raise ValueError(f"header {name!r} holds a line break or a NUL")
        lines.append(line)
    return "".join(lines).encode("latin-1")


__all__ = [
    "AnswerCut",
    "ConnectFailed",
    "ConnectTimeout",
    "HttpParserError",
    "IdleTimeout",
    "LeanTransport",
]
