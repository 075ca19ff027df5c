"""Request header limits for uvicorn: header lines and their bytes, answered 431 past either.

uvicorn's httptools protocol takes any number of headers of any size (its parser holds one
header until it ends: a 16 MiB header is 16 MiB held, and copied as it grows), and has no
option to limit them. ``limited_http`` makes a subclass that counts, as the bytes arrive:

- header lines and their bytes, as the parser hands each one over;
- every byte received while a request's headers are still incomplete (a header that never
  ends is never handed over);

and past ``limits.headers`` or ``limits.header_bytes`` answers 431 with rollgym's error body,
sends no request to the app, and closes the connection, reading (and dropping) what the
client still sends for a moment first, so that the client reads the 431 rather than a reset.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rollgym.config import ServerLimits
from rollgym.errors import RequestTooLarge

LINGER_S = 2.0
"""How long a refused connection is read (and dropped) before it is closed."""


class _TooLarge(Exception):
    """Raised in a parser callback to stop parsing the request: (limit, what was past it)."""


class LimitedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with request header limits (``limited_http`` sets them)."""

    limits: ServerLimits = ServerLimits()
    server_name: str = "server"
    # The two limits as plain integers: read on every header, where a pydantic model's
    # attribute costs several times a class attribute.
    max_headers = limits.headers
    max_header_bytes = limits.header_bytes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = True  # reading a request's headers (or waiting for the next one)
        self._head_unparsed = 0
        self._head_lines = 0
        self._head_bytes = 0
        self._ended = False  # a request ended in the read being parsed
        self._refusal: str | None = None  # why the request is refused, once it is

    def data_received(self, data: bytes) -> None:
        # uvicorn's own, but a limit raised in a callback is answered 431, not 400.
        if self._refusal is not None:
            return  # refused: dropped until the connection closes
        self._unset_keepalive_if_required()
        self._ended = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _TooLarge):
                self._refuse(*exc.__context__.args)
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._head_open and not self._ended:
            # In the headers before and after, no request ended in between (whose body this
            # read would hold): all of this read was header bytes.
            self._head_unparsed += len(data)
            if self._head_unparsed > self.max_header_bytes:
                self._refuse("header_bytes", self._past_bytes())

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines += 1
        self._head_bytes += len(name) + len(value)
        if self._head_lines > self.max_headers:
            raise _TooLarge("headers", f"more than {self.max_headers} request header lines")
        if self._head_bytes > self.max_header_bytes:
            raise _TooLarge("header_bytes", self._past_bytes())
        super().on_header(name, value)

    def _past_bytes(self) -> str:
        return f"request line and headers past {self.limits.header_bytes} bytes"

    def on_headers_complete(self) -> None:
        self._head_open = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open = self._ended = True
        self._head_unparsed = self._head_lines = self._head_bytes = 0

    def _refuse(self, limit: str, what: str) -> None:
        self._refusal = limit
        transport = self.transport
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's headers, while an earlier answer is being written: a 431
            # would land inside it. The connection goes; the earlier request's client sees it.
            transport.close()
            return
        transport.write(_answer_431(self.server_name, limit, what, self.limits))
        if transport.can_write_eof():
            transport.write_eof()  # the client reads the 431 and the end of it
        self.loop.call_later(LINGER_S, transport.close)

    def eof_received(self) -> None:
        if self._refusal is not None:
            self.transport.close()  # the client is done sending: nothing left to drop


def _answer_431(server: str, limit: str, what: str, limits: ServerLimits) -> bytes:
    err = RequestTooLarge(
        f"{what} (limits.{limit} = {getattr(limits, limit)}); if such requests are expected, "
        f"raise servers.{server}.limits.{limit} in the config",
        status=431, server=server, retryable=False,
    )  # fmt: skip
    body = orjson.dumps({"error": err.to_dict()})
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    ) + body


def limited_http(limits: ServerLimits, server: str) -> type[asyncio.Protocol]:
    """uvicorn's ``http=`` protocol class for server ``server`` with ``limits``."""
    fields = {
        "limits": limits,
        "server_name": server,
        "max_headers": limits.headers,
        "max_header_bytes": limits.header_bytes,
    }
    return type("LimitedHttpTools", (LimitedHttpTools,), fields)
