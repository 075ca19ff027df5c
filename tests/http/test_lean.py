"""The default transport against real sockets: raw HTTP servers on 127.0.0.1 that answer the
ways servers do (lengths, chunks, until-close, gzip, garbage, silence, hanging up), connection
reuse and its limits, and the typed errors each failure becomes."""

from __future__ import annotations

import asyncio
import gc
import gzip
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from rollgym.errors import ConnectError, ConnectionLost, ProtocolError, ReadTimeout, TransportError
from rollgym.http.lean import LeanTransport
from rollgym.http.transport import Request

pytestmark = pytest.mark.timeout(30)

Answer = Callable[[bytes], bytes | None]
"""Given a request's bytes, what to write back (None: write nothing and keep waiting)."""


@asynccontextmanager
async def raw_server(answer: Answer, *, close_after: bool = False) -> AsyncIterator[dict]:
    """A TCP server on 127.0.0.1:0 answering each request with ``answer(request)``."""
    seen: dict = {"connections": 0, "requests": []}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                seen["requests"].append(head + body)
                out = answer(head + body)
                if out is None:
                    await asyncio.sleep(3600)
                writer.write(out)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    seen["url"] = f"http://127.0.0.1:{port}"
    async with server:
        yield seen


def ok(body: bytes, *extra: bytes) -> Answer:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + b"".join(extra)
    return lambda _: head + b"content-length: %d\r\n\r\n" % len(body) + body


async def send(t: LeanTransport, url: str, **kw: float | None) -> object:
    params = {"timeout": 5.0, "connect_timeout": 2.0, "idle_timeout": None} | kw
    return await t.send(Request(url + "/x", b'{"a": 1}', {"x-rollgym-rollout": "3:0"},
                                server="s", endpoint="/x", **params))  # type: ignore[arg-type]  # fmt: skip


async def test_keep_alive_reuses_one_connection_and_sends_json() -> None:
    async with raw_server(ok(b'{"ok": true}')) as srv:
        t = LeanTransport()
        for _ in range(5):
            answer = await send(t, srv["url"])
            assert answer.status == 200 and answer.body == b'{"ok": true}'  # type: ignore[attr-defined]
        await t.close()
    assert srv["connections"] == 1
    first = srv["requests"][0]
    assert first.startswith(b"POST /x HTTP/1.1\r\n")
    assert b"content-type: application/json\r\n" in first.lower()
    assert b"x-rollgym-rollout: 3:0\r\n" in first and first.endswith(b'{"a": 1}')


async def test_chunked_until_close_and_gzip_bodies_are_read_whole() -> None:
    chunked = (
        b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{"a\r\n5\r\n": 2}\r\n0\r\n\r\n'
    )
    async with raw_server(lambda _: chunked) as srv:
        t = LeanTransport()
        assert (await send(t, srv["url"])).body == b'{"a": 2}'  # type: ignore[attr-defined]
        await t.close()
    until_close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + b'{"b": 3}'
    async with raw_server(lambda _: until_close, close_after=True) as srv:
        t = LeanTransport()
        for _ in range(2):  # a closed connection is not reused: a new one each time
            assert (await send(t, srv["url"])).body == b'{"b": 3}'  # type: ignore[attr-defined]
        await t.close()
    assert srv["connections"] == 2
    zipped = gzip.compress(b'{"c": 4}')
    async with raw_server(ok(zipped, b"content-encoding: gzip\r\n")) as srv:
        t = LeanTransport()
        assert (await send(t, srv["url"])).body == b'{"c": 4}'  # type: ignore[attr-defined]
        await t.close()


async def test_status_retry_after_and_cookies_are_reported() -> None:
    answer = (b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\n"
              b"set-cookie: session=abc; Path=/\r\nset-cookie: other=1\r\ncontent-length: 2\r\n\r\n{}")  # fmt: skip
    async with raw_server(lambda _: answer) as srv:
        t = LeanTransport()
        got = await send(t, srv["url"])
        await t.close()
    assert got.status == 503 and got.retry_after == "7"  # type: ignore[attr-defined]
    assert dict(got.cookies) == {"session": "abc", "other": "1"}  # type: ignore[attr-defined]


async def test_each_failure_is_the_typed_error_aiohttp_gave(dead_url: Callable[[], str]) -> None:
    t = LeanTransport()
    with pytest.raises(ConnectError, match=r"cannot connect to s at 127\.0\.0\.1:\d+"):
        await send(t, dead_url())
    async with raw_server(lambda _: None) as srv:  # says nothing
        with pytest.raises(ReadTimeout, match=r"sent nothing for 0\.2s"):
            await send(t, srv["url"], idle_timeout=0.2)
        with pytest.raises(ReadTimeout, match=r"did not answer within 0\.3s"):
            await send(t, srv["url"], timeout=0.3)
    async with raw_server(lambda _: b"SPAM SPAM SPAM\r\n\r\n") as srv:
        with pytest.raises(ProtocolError, match="not valid HTTP"):
            await send(t, srv["url"])
    cut = b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"half'
    async with raw_server(lambda _: cut, close_after=True) as srv:
        with pytest.raises(ConnectionLost, match="closed the connection mid-answer"):
            await send(t, srv["url"])
    async with raw_server(lambda _: b"", close_after=True) as srv:
        with pytest.raises(ConnectionLost, match="before answering"):
            await send(t, srv["url"])
    with pytest.raises(TransportError, match="line break"):
        await t.send(Request(dead_url() + "/x", b"{}", {"x-a": "1\r\nx-b: 2"}, timeout=1,
                     connect_timeout=1, server="s", endpoint="/x"))  # fmt: skip
    await t.close()


async def test_an_unfinished_request_never_leaves_its_connection_for_the_next() -> None:
    """A request cut by its timeout closes its connection: the late answer must not be read
    as the next request's."""
    calls = {"n": 0}

    def answer(_: bytes) -> bytes | None:
        calls["n"] += 1
        return None if calls["n"] == 1 else ok(b'{"n": %d}' % calls["n"])(b"")

    async with raw_server(answer) as srv:
        t = LeanTransport()
        with pytest.raises(ReadTimeout):
            await send(t, srv["url"], timeout=0.2)
        got = await send(t, srv["url"])
        await t.close()
    assert got.body == b'{"n": 2}'  # type: ignore[attr-defined]
    assert srv["connections"] == 2


async def test_the_connection_limit_queues_requests_instead_of_opening_more() -> None:
    async with raw_server(ok(b"{}")) as srv:
        t = LeanTransport(limit=2)
        results = await asyncio.gather(*(send(t, srv["url"]) for _ in range(10)))
        await t.close()
    assert all(r.status == 200 for r in results)  # type: ignore[attr-defined]
    assert srv["connections"] <= 2


def test_https_and_credentials_go_to_aiohttp() -> None:
    from rollgym.http.lean import _plain_http

    assert _plain_http("http://127.0.0.1:8000/v1/chat") is not None
    assert _plain_http("https://api.openai.com/v1/chat") is None
    assert _plain_http("http://user:pw@127.0.0.1:8000/v1") is None
    assert _plain_http("http://[::1]:8000/v1") is None


async def test_bytes_past_the_answer_close_the_connection() -> None:
    """A server that answers twice to one request is out of step: the first answer stands,
    and the connection is not used again."""
    twice = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}" * 2
    async with raw_server(lambda _: twice) as srv:
        t = LeanTransport()
        for _ in range(2):
            assert (await send(t, srv["url"])).body == b"{}"  # type: ignore[attr-defined]
        await t.close()
    assert srv["connections"] == 2


async def test_a_server_closing_an_idle_connection_costs_no_request() -> None:
    """A server that closes its keep-alive connections after each answer (as a short
    keep-alive timeout does): the next request goes on a new connection, not the closed one."""
    framed = ok(b"{}")
    async with raw_server(framed, close_after=True) as srv:
        t = LeanTransport()
        for _ in range(3):
            assert (await send(t, srv["url"])).status == 200  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)  # the server's close arrives while the connection idles
        await t.close()
    assert srv["connections"] == 3


async def test_a_woken_waiter_that_is_cancelled_passes_its_turn_on() -> None:
    """At the limit, a request woken for a free connection but cancelled before it runs must
    hand the connection to the next waiter, who would otherwise wait out its timeout."""
    from rollgym.http.lean import _Connection, _Pool

    async with raw_server(ok(b"{}")) as srv:
        port = int(srv["url"].rsplit(":", 1)[1])
        t = LeanTransport(limit=1)
        pool = _Pool("127.0.0.1", port)
        pool.open = 1  # the one connection allowed is in use
        woken = asyncio.create_task(t._connection(pool, 1.0))
        other = asyncio.create_task(t._connection(pool, 1.0))
        await asyncio.sleep(0)
        _, conn = await asyncio.get_running_loop().create_connection(_Connection, "127.0.0.1", port)
        conn.idle_since = time.monotonic()
        pool.idle.append(conn)
        pool.wake()  # the first waiter's turn...
        woken.cancel()  # ...but it is cancelled before it runs
        assert await asyncio.wait_for(other, 1.0) is conn
        conn.close()


def test_urls_it_would_send_raw_go_to_aiohttp() -> None:
    from rollgym.http.lean import _plain_http

    assert _plain_http("http://127.0.0.1:8000/v1/日本") is None  # aiohttp percent-encodes
    assert _plain_http("http://例え.jp/v1") is None


async def test_deadlines_of_many_requests_expire_each_on_time_and_leave_nothing() -> None:
    """The whole-attempt timeouts of requests in flight share one clock: each expires at its
    own deadline (not sooner, at most a tick or two later), whatever the others' deadlines,
    and a request that ends in time leaves no entry behind."""

    def answer(request: bytes) -> bytes | None:
        return ok(b"{}")(b"") if b"fast" in request else None

    async with raw_server(answer) as srv:
        t = LeanTransport()
        url = srv["url"] + "/x"
        loop = asyncio.get_running_loop()

        async def timed(timeout: float, payload: bytes) -> tuple[float, float, str]:
            started = loop.time()
            try:
                await t.send(Request(url, payload, None, timeout=timeout, connect_timeout=2.0,
                             server="s", endpoint="/x"))  # fmt: skip
                outcome = "answered"
            except ReadTimeout:
                outcome = "timeout"
            return timeout, loop.time() - started, outcome

        # Interleaved: long deadlines added first must not hold back the short ones.
        timeouts = [0.9, 0.15, 0.6, 0.3, 0.45, 0.05, 0.75]
        results = await asyncio.gather(
            *(timed(s, b'{"hang": 1}') for s in timeouts),
            *(timed(5.0, b'{"fast": %d}' % i) for i in range(20)),
        )
        for timeout, took, outcome in results:
            if timeout == 5.0:
                assert outcome == "answered"
            else:
                assert outcome == "timeout"
                assert timeout <= took < timeout + 0.25, (timeout, took)
        assert not t._clock._slots and t._clock._handle is None  # every entry gone
        await t.close()


async def test_an_idle_connection_keeps_nothing_of_its_last_answer() -> None:
    """A collector winding down holds thousands of idle connections: none may keep the body
    of the answer it carried last (nor a parser)."""
    async with raw_server(ok(b'{"big": "' + b"x" * 50_000 + b'"}')) as srv:
        t = LeanTransport()
        answer = await send(t, srv["url"])
        assert len(answer.body) > 50_000  # type: ignore[attr-defined]
        (pool,) = t._pools.values()
        (conn,) = pool.idle
        assert conn.answer is None and conn.parser is None and conn.waiter is None
        assert (await send(t, srv["url"])).status == 200  # type: ignore[attr-defined]
        await t.close()
    assert srv["connections"] == 1


# The first loop's request is left pending on purpose; asyncio says so when it is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_client_moved_to_a_new_event_loop_still_times_out() -> None:
    """A loop closed with a request still in flight leaves that request's deadline behind;
    the next loop's requests must expire on their own deadlines, not wait on a dead timer."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:  # a server that reads nothing and answers nothing
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    t = LeanTransport()
    try:
        first = asyncio.new_event_loop()
        dropped = first.create_task(send(t, url, timeout=0.4))
        first.run_until_complete(asyncio.sleep(0.1))  # in flight, its deadline armed
        first.close()  # without cancelling it: its entry and timer stay on the clock
        assert t._clock._slots and t._clock._handle is not None

        async def second() -> None:
            # Its own timeout fires (a ReadTimeout), not a hang on the dead loop's timer; the
            # outer bound is only there to fail rather than hang, wide for a busy machine.
            with pytest.raises(ReadTimeout):
                await asyncio.wait_for(send(t, url, timeout=0.6), 20)

        asyncio.run(second())
        del dropped, first
        gc.collect()  # the dropped request is collected here, under this test's filter
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept()
        listener.close()
        for conn in held:
            conn.close()


async def test_an_infinite_timeout_is_no_deadline() -> None:
    """``attempt_timeout: .inf`` is a valid policy: the request is sent once and answered."""
    async with raw_server(ok(b'{"ok": 1}')) as srv:
        t = LeanTransport()
        answer = await send(t, srv["url"], timeout=float("inf"))
        assert answer.body == b'{"ok": 1}'  # type: ignore[attr-defined]
        assert not t._clock._slots
        await t.close()
    assert len(srv["requests"]) == 1


async def test_a_bare_status_line_after_an_answer_keeps_the_connection_out_of_the_pool() -> None:
    """Bytes of a second answer, even a status line alone, arriving with the first: the first
    stands, and the connection, out of step, never carries the next request."""
    body = b'{"n": 1}'
    stray = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%sHTTP/1.1 200 OK\r\n" % (
        len(body), body,
    )  # fmt: skip
    async with raw_server(lambda _: stray) as srv:
        t = LeanTransport()
        first = await send(t, srv["url"])
        second = await send(t, srv["url"])
        await t.close()
    assert first.body == second.body == body  # type: ignore[attr-defined]
    assert srv["connections"] == 2


async def test_the_clock_keeps_no_more_than_the_deadlines_in_flight() -> None:
    """Requests ending long before their deadlines (the usual case) leave no trail: the heap
    stays within twice the slots in use, and empties with them."""
    from rollgym.http.lean import _Clock, _Connection

    clock = _Clock()
    now = asyncio.get_running_loop().time()
    held = _Connection()
    clock.add(held, now + 600)
    for i in range(20_000):
        conn = _Connection()
        clock.add(conn, now + 600 + (i + 1) * clock.TICK)
        clock.remove(conn)
        assert len(clock._heap) <= 2 * len(clock._slots) + 65
    assert len(clock._slots) == 1
    clock.remove(held)
    assert not clock._slots and not clock._heap and clock._handle is None
