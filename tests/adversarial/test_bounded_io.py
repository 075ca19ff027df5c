"""Bounded I/O: what a hostile or broken peer can make a rollgym process hold.

Client side, both transports (the default one and aiohttp's), against raw servers on 127.0.0.1
that answer a gzip bomb, a chunked body without end, a body read until a close that never
comes, a header without end, 100,000 headers, a declared length of a gigabyte: each stops at
its limit with ``AnswerTooLarge`` naming the limit, and the server could not push more than
the limit and the sockets' buffers. Server side: 100,000 request headers or one 1 MiB header
get 431, a huge ``/seed_session`` 413, held sessions stay within their byte bound, and
``POST /verify/`` is no redirect; after each the server answers as before.
"""

from __future__ import annotations

import asyncio
import functools
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.config import AnswerLimits, RetryPolicy, ServerConfig, parse_config
from rollgym.errors import AnswerTooLarge, HTTPStatusError, InvalidRequest, RequestTooLarge
from rollgym.http import AiohttpTransport, HttpClient, LeanTransport, Request, Target, Transport
from rollgym.launch import Supervisor
from rollgym.server.resources import ResourcesServer
from rollgym.testing import serve_server

pytestmark = pytest.mark.timeout(90)

MiB = 1 << 20
CAP = 48 * MiB
"""The most a hostile test server sends; a client without limits reads it all and then waits
for more, so on code without limits these tests fail (a timeout, not a crash)."""
SMALL = AnswerLimits(body_bytes=1 * MiB, decompressed_bytes=1 * MiB)
WAIT = 20.0  # seconds: every wait on the network is bounded by this

Chunks = Callable[[], Iterator[bytes]]


@asynccontextmanager
async def hostile(head: bytes, body: Chunks = lambda: iter(())) -> AsyncIterator[dict[str, Any]]:
    """A server on 127.0.0.1:0 that reads one request, writes ``head`` and then ``body``'s
    chunks (up to ``CAP`` bytes), then waits. ``sent``: bytes the client let it write;
    ``done`` is set once the connection is over."""
    state: dict[str, Any] = {"sent": 0, "requests": 0, "done": asyncio.Event()}
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in request.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")), 0,
            )  # fmt: skip
            await reader.readexactly(length)
            state["requests"] += 1
            writer.write(head)
            await writer.drain()
            for chunk in body():
                writer.write(chunk)
                await writer.drain()
                state["sent"] += len(chunk)
                if state["sent"] >= CAP:
                    break
            await reader.read()  # until the client hangs up
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            state["done"].set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state["url"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with server:
            yield state
    finally:
        for task in handlers:
            task.cancel()


def endless(piece: bytes) -> Chunks:
    def chunks() -> Iterator[bytes]:
        while True:
            yield piece

    return chunks


@functools.cache
def gzip_bomb() -> bytes:
    """300 MiB of zeros, gzip-compressed (about 300 KB), made without holding 300 MiB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    parts = [packer.compress(zeros) for _ in range(300)]
    parts.append(packer.flush())
    return b"".join(parts)


def transport(kind: str, limits: AnswerLimits | None = None) -> LeanTransport | AiohttpTransport:
    kw = {} if limits is None else {"limits": limits}
    return LeanTransport(**kw) if kind == "lean" else AiohttpTransport(**kw)


async def send(t: Transport, url: str) -> object:
    return await t.send(
        Request(url + "/v1/responses", b"{}", None, WAIT, 5.0, "up", "/v1/responses")
    )


async def too_large(t: LeanTransport | AiohttpTransport, srv: dict[str, Any]) -> AnswerTooLarge:
    """The error of one send to ``srv``, once the server's side of it is over too."""
    try:
        with pytest.raises(AnswerTooLarge) as caught:
            await send(t, srv["url"])
    finally:
        await t.close()
    await asyncio.wait_for(srv["done"].wait(), WAIT)
    err = caught.value
    assert err.server == "up" and err.endpoint == "/v1/responses" and not err.retryable
    assert "retry.answer_limits." in err.message  # how to raise it
    return err


TRANSPORTS = pytest.mark.parametrize("kind", ["lean", "aiohttp"])


# -- what a caller reads of an answer -------------------------------------------------------


@TRANSPORTS
async def test_gzip_bomb_stops_at_the_decompressed_limit(kind: str) -> None:
    bomb = gzip_bomb()
    assert len(bomb) < MiB  # 300 MiB once decoded
    head = b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(bomb)
    async with hostile(head + bomb) as srv:
        err = await too_large(transport(kind), srv)  # the defaults: 64 MiB decoded
    assert "answer_limits.decompressed_bytes = 67108864" in err.message


@TRANSPORTS
async def test_endless_chunked_body_stops_at_the_body_limit(kind: str) -> None:
    piece = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    async with hostile(head, endless(piece)) as srv:
        err = await too_large(transport(kind, SMALL), srv)
    assert f"answer_limits.body_bytes = {MiB}" in err.message and err.status == 200
    assert srv["sent"] < CAP  # it stopped reading: the server could not write it all


@TRANSPORTS
async def test_body_read_until_a_close_that_never_comes_stops_at_the_body_limit(
    kind: str,
) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
    async with hostile(head, endless(b"[" * 0x10000)) as srv:
        err = await too_large(transport(kind, SMALL), srv)
    assert "answer_limits.body_bytes" in err.message
    assert srv["sent"] < CAP


@TRANSPORTS
async def test_header_without_end_stops_at_the_header_limit(kind: str) -> None:
    async with hostile(b"HTTP/1.1 200 OK\r\nx-big: ", endless(b"a" * 0x10000)) as srv:
        err = await too_large(transport(kind), srv)  # the defaults: 64 KiB of headers
    assert "answer_limits.header_bytes = 65536" in err.message
    assert srv["sent"] < CAP


@TRANSPORTS
async def test_a_hundred_thousand_headers_stop_at_the_count_limit(kind: str) -> None:
    lines = b"".join(b"x-h%05d: v\r\n" % i for i in range(100_000))
    async with hostile(b"HTTP/1.1 200 OK\r\n" + lines + b"content-length: 2\r\n\r\n{}") as srv:
        err = await too_large(transport(kind), srv)
    assert "answer_limits.headers = 100" in err.message


@TRANSPORTS
async def test_long_header_lines_stop_at_the_header_bytes_limit(kind: str) -> None:
    # Lines each shorter than the 64 KiB total, fewer than the 100 allowed: aiohttp checks its
    # limits per line, so with a line limit of the whole total it held 100 of them (6 MiB)
    # and stopped only at the count. Each transport stops within the total's bound instead.
    line = b"x-long: " + b"a" * (60 * 1024) + b"\r\n"
    async with hostile(b"HTTP/1.1 200 OK\r\n", endless(line)) as srv:
        err = await too_large(transport(kind), srv)
    assert "answer_limits.header_bytes = 65536" in err.message
    assert srv["sent"] < CAP


@TRANSPORTS
async def test_an_answer_with_a_few_kib_of_cookie_is_read(kind: str) -> None:
    cookie = "s" * 4000  # about the most a browser keeps of one cookie
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"set-cookie: session=%s; Path=/; HttpOnly\r\n"
        b"x-trace: %s\r\ncontent-length: 2\r\n\r\n{}"
    ) % (cookie.encode(), b"t" * 2000)
    async with hostile(head) as srv:
        t = transport(kind)
        try:
            answer = await send(t, srv["url"])
        finally:
            await t.close()
    assert answer.body == b"{}" and answer.cookies == (("session", cookie),)  # type: ignore[attr-defined]


@TRANSPORTS
async def test_a_declared_length_past_the_limit_is_refused_before_its_body(kind: str) -> None:
    # Nothing of the body ever comes: only the declared length can end this before the timeout.
    async with hostile(b"HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n") as srv:
        err = await too_large(transport(kind), srv)
    assert "answer_limits.body_bytes = 67108864 (1073741824 or more)" in err.message


@TRANSPORTS
async def test_answers_within_the_limits_are_read_and_decoded(kind: str) -> None:
    for encoding, packed in (
        (b"gzip", zlib.compress(b'{"ok": 1}', wbits=31)),
        (b"deflate", zlib.compress(b'{"ok": 1}')),
        (b"deflate", zlib.compress(b'{"ok": 1}', wbits=-15)),  # raw deflate, as some send it
    ):
        head = b"HTTP/1.1 200 OK\r\ncontent-encoding: %s\r\ncontent-length: %d\r\n\r\n" % (
            encoding, len(packed),
        )  # fmt: skip
        async with hostile(head + packed) as srv:
            t = transport(kind)
            try:
                answer = await send(t, srv["url"])
            finally:
                await t.close()
        assert answer.body == b'{"ok": 1}', encoding  # type: ignore[attr-defined]


@TRANSPORTS
async def test_the_client_holds_answers_to_the_called_servers_limits_and_never_retries(
    kind: str,
) -> None:
    policy = RetryPolicy(idempotent=True, max_attempts=3, answer_limits=SMALL)
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (2 * MiB)
    async with hostile(head, endless(b" " * 0x10000)) as srv:
        inner = transport(kind)  # its own limits are the defaults: the target's must win
        try:
            async with HttpClient(transport=inner) as http:
                with pytest.raises(AnswerTooLarge) as caught:
                    await http.call(Target.single("up", srv["url"], policy), "/v1/responses", {})
        finally:
            await inner.close()
    err = caught.value
    assert err.attempts == 1 and srv["requests"] == 1 and not err.retryable
    assert "retry.answer_limits.body_bytes of server 'up'" in err.message


def test_answer_limits_are_part_of_a_servers_retry_policy_in_the_config() -> None:
    cfg = ServerConfig.model_validate(
        {
            "kind": "model",
            "impl": "scripted",
            "retry": {"answer_limits": {"body_bytes": 256 * MiB}},
            "limits": {"headers": 200, "seed_bytes": MiB},
        }
    )
    assert cfg.retry.answer_limits.body_bytes == 256 * MiB
    assert cfg.retry.answer_limits.decompressed_bytes == 64 * MiB  # the others keep defaults
    assert cfg.limits.headers == 200 and cfg.limits.header_bytes == 64 * 1024
    assert cfg.retry.max_attempts == 3  # the kind's retry defaults still apply


# -- what a rollgym server takes in ---------------------------------------------------------


async def exchange(url: str, request: bytes) -> bytes:
    """Send raw ``request`` bytes to ``url``'s server and read its answer until it closes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), WAIT)

    async def push() -> None:
        try:
            writer.write(request)
            await writer.drain()
        except ConnectionError:
            pass  # refused mid-request: the answer is what counts

    pusher = asyncio.create_task(push())
    try:
        return await asyncio.wait_for(reader.read(), WAIT)
    finally:
        pusher.cancel()
        writer.close()


async def healthy(url: str) -> None:
    async with HttpClient() as http:
        health = await http.call(Target.single("env", url), "/health", {}, deadline=WAIT)
    assert health["status"] == "ok"


def refused_with(answer: bytes, status: int, limit: str) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), head[:200]
    error = orjson.loads(body)["error"]
    assert error["type"] == "request_too_large" and error["status"] == status
    assert f"servers.env.limits.{limit}" in error["message"]  # how to raise it
    return error


async def test_a_hundred_thousand_request_headers_get_431_and_the_server_carries_on() -> None:
    lines = b"".join(b"x-h%05d: v\r\n" % i for i in range(100_000))
    request = (
        b"POST /seed_session HTTP/1.1\r\nhost: env\r\n" + lines + b"content-length: 2\r\n\r\n{}"
    )
    async with serve_server("echo", name="env") as (url, server):
        answer = await exchange(url, request)
        refused_with(answer, 431, "headers")
        await healthy(url)
        assert not server._sessions  # type: ignore[attr-defined]  # the app never saw it


async def test_a_one_mib_request_header_gets_431_and_the_server_carries_on() -> None:
    request = b"POST /seed_session HTTP/1.1\r\nhost: env\r\nx-big: " + b"a" * MiB + b"\r\n\r\n"
    async with serve_server("echo", name="env") as (url, _):
        for _ in range(2):
            refused_with(await exchange(url, request), 431, "header_bytes")
        # And one that never ends its header line at all.
        never_ends = b"POST /seed_session HTTP/1.1\r\nhost: env\r\nx-big: " + b"a" * (2 * MiB)
        refused_with(await exchange(url, never_ends), 431, "header_bytes")
        await healthy(url)


async def test_a_huge_seed_session_gets_413_and_nothing_is_held() -> None:
    row = orjson.dumps({f"k{i}": i for i in range(1_500_000)})  # 26 MB, as in the issue
    async with serve_server("echo", name="env") as (url, server):
        async with HttpClient() as http:
            with pytest.raises(HTTPStatusError) as caught:
                await http.call(Target.single("env", url), "/seed_session", row, deadline=WAIT)
            err = caught.value
            assert err.status == 413 and isinstance(err.origin, RequestTooLarge)
            assert "servers.env.limits.seed_bytes = 16777216" in err.message
            assert not server._sessions  # type: ignore[attr-defined]
            # The same connection pool goes on: the server and the client both carry on.
            seeded = await http.call(Target.single("env", url), "/seed_session", {"a": 1})
        assert seeded["session_id"]
        await healthy(url)


async def test_held_sessions_stay_within_their_byte_bound_oldest_dropped_first() -> None:
    limits = {"seed_bytes": 256 * 1024, "sessions_bytes": MiB}
    row = {"expected_answer": "x", "pad": "p" * 200_000}  # about 200 KB each
    async with serve_server("echo", name="env", limits=limits) as (url, server):
        env: ResourcesServer = server  # type: ignore[assignment]
        target = Target.single("env", url)
        async with HttpClient() as http:
            ids = [(await http.call(target, "/seed_session", row))["session_id"] for _ in range(12)]
            held = env._sessions  # type: ignore[attr-defined]
            assert sum(s.size for s in held.values()) <= MiB
            assert ids[-1] in held and ids[0] not in held
            # A dropped session's rollout learns why, and which option keeps more.
            with pytest.raises(HTTPStatusError) as caught:
                await http.call(
                    target, "/verify", {**row, "response": {"output": []}},
                    headers={"x-rollgym-session": ids[0]},
                )  # fmt: skip
            assert caught.value.status == 404
            assert isinstance(caught.value.origin, InvalidRequest)
            assert "servers.env.limits.sessions_bytes" in caught.value.message
            verified = await http.call(
                target, "/verify", {**row, "response": {"output": []}},
                headers={"x-rollgym-session": ids[-1]},
            )  # fmt: skip
            assert verified["reward"] == 0.0
            assert ids[-1] not in held


async def test_verify_with_a_trailing_slash_is_no_redirect_built_from_the_host_header() -> None:
    body = orjson.dumps({"response": {"output": []}})
    request = (
        b"POST /verify/ HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    ) + body
    async with serve_server("echo", name="env") as (url, _):
        answer = await exchange(url, request)
        head, _, raw = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 404 "), head
        assert b"location:" not in head.lower() and b"evil.example" not in answer
        assert orjson.loads(raw)["error"]["status"] == 404
        await healthy(url)


async def test_a_launched_server_holds_requests_to_the_limits_its_config_gives(
    tmp_path: Path,
) -> None:
    config = parse_config(
        {"servers": {"env": {"kind": "resources", "impl": "echo", "limits": {"headers": 20}}}},
        "test-config",
    )
    supervisor = Supervisor(config, log_dir=tmp_path / "logs", startup_timeout=30)
    try:
        (url,) = (await supervisor.start())["env"]
        lines = b"".join(b"x-h%02d: v\r\n" % i for i in range(21))
        request = b"POST /health HTTP/1.1\r\nhost: env\r\nconnection: close\r\n"
        refused_with(await exchange(url, request + lines + b"\r\n"), 431, "headers")
        fine = await exchange(url, request + lines[: 10 * 10] + b"\r\n")  # 10 + 2 headers
        assert fine.startswith(b"HTTP/1.1 200 "), fine[:200]
        await healthy(url)
    finally:
        await supervisor.stop()
