"""The collector's metrics on a port of its own: ``GET /metrics``, nothing else.

A server that small is written here on asyncio's streams rather than run under uvicorn:
uvicorn's ``serve`` takes over SIGINT and SIGTERM, which are the run's (an interrupted run
records why it stopped), and the collector's event loop must keep serving rollouts, not parse
scrapes. One request per connection (``Connection: close``): a scraper asks every few seconds.
Every read is bounded in bytes and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from rollgym.errors import RollgymError
from rollgym.prometheus.exposition import Exposition
from rollgym.wire import METRICS_ENDPOINT

log = logging.getLogger("rollgym.prometheus")

MAX_HEAD_BYTES = 16 * 1024
"""The longest request head (request line and headers) taken."""
READ_TIMEOUT = 10.0
"""Seconds a client has to send its request head."""


class MetricsServer:
    """Serves ``exposition`` at ``GET /metrics`` on ``sock``, a listening socket reached at
    ``base_url`` (``http://host:port``). The owner binds it (``rollgym.launch.ports``, the one
    place rollgym binds a port), so a port that cannot be bound fails there, before this."""

    def __init__(self, exposition: Exposition, sock: socket.socket, base_url: str) -> None:
        self.exposition = exposition
        self._sock: socket.socket | None = sock
        self.url = base_url + METRICS_ENDPOINT
        self._server: asyncio.Server | None = None

    async def start(self) -> MetricsServer:
        assert self._sock is not None, "started twice"
        self._server = await asyncio.start_server(
            self._serve, sock=self._sock, limit=MAX_HEAD_BYTES
        )
        return self

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await server.wait_closed()
        elif self._sock is not None:
            self._sock.close()
        self._sock = None

    async def __aenter__(self) -> MetricsServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            await self.exposition.load()
            status, content_type, body = self._answer(head)
            writer.write(
                b"HTTP/1.1 %b\r\ncontent-type: %b\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%b" % (status, content_type.encode(), len(body), body)
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client that sent no complete request head in time, or too long a one
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    def _answer(self, head: bytes) -> tuple[bytes, str, bytes]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return b"400 Bad Request", "text/plain", b"bad request line\n"
        method, target, _ = parts
        path = target.split("?", 1)[0]
        if path != METRICS_ENDPOINT:
            return b"404 Not Found", "text/plain", b"only GET /metrics here\n"
        if method not in ("GET", "HEAD"):
            return b"405 Method Not Allowed", "text/plain", b"only GET /metrics here\n"
        accept = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        try:
            body, content_type = self.exposition.render(accept)
        except RollgymError as err:  # prometheus_client missing: say so
            return b"501 Not Implemented", "text/plain", f"{err.message}\n".encode()
        except Exception:  # a bug in a family must not take the collector down
            log.exception("metrics scrape failed")
            return b"500 Internal Server Error", "text/plain", b"metrics failed; see the log\n"
        return b"200 OK", content_type, b"" if method == "HEAD" else body
