"""Red team: answers a hostile or broken server may give rollgym's HTTP client. Each becomes
one typed error for the call, with nothing logged as the event loop's fatal error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from rollgym.config import RetryPolicy
from rollgym.errors import ProtocolError
from rollgym.http import HttpClient, Target

pytestmark = pytest.mark.timeout(30)

SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"


@asynccontextmanager
async def switching_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server on 127.0.0.1:0 that answers every request 101 and then holds the connection
    open until the client closes it (so nothing but the 101 can end the call)."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            requests.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(SWITCHING)
            await writer.drain()
            await reader.read()  # until the client hangs up
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", requests


async def test_a_101_answer_is_a_protocol_error_not_a_fatal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    client = HttpClient()
    policy = RetryPolicy(max_attempts=3, backoff_initial=0.01, backoff_max=0.02)
    try:
        async with switching_server() as (url, requests):
            with pytest.raises(ProtocolError, match="101 Switching Protocols") as caught:
                await client.call(Target.single("env", url, policy), "/echo", {}, deadline=10)
    finally:
        await client.close()
    err = caught.value
    assert (err.server, err.endpoint, err.retryable) == ("env", "/echo", False)
    assert len(requests) == 1  # not retried: the same request gets the same upgrade
    assert not [r for r in caplog.records if "Fatal error" in r.getMessage() or r.exc_info]
