"""The seam where one attempt leaves the process: one ``Request`` in, one ``RawAnswer`` out.

``HttpClient`` decides what to send, where, and whether to try again; a ``Transport`` only sends
one POST and reports what came back, so tests can drive every retry path through a fake one
with no sockets. The transports (``rollgym.http.default.default_transport`` builds the usual
pair):

- ``LeanTransport`` (``rollgym.http.lean``): plain ``http://``, the hops of a rollout;
- ``AiohttpTransport`` (``rollgym.http.aiohttp_transport``): ``https://`` and URLs with
  credentials, the lean one's ``fallback``;
- ``InProcessTransport`` (``rollgym.http.inprocess``): ASGI apps of this process;
- ``LivenessTransport`` (``rollgym.models.liveness``): the proxy's, probing a silent upstream.

This module imports no transport: each of them, and ``rollgym.http.translate``, imports it. The
exceptions at the bottom are what the lean transport raises before ``translate`` turns them
into rollgym errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie
from typing import NamedTuple, Protocol

JSON_HEADERS = {"content-type": "application/json"}


class Request(NamedTuple):
    """One attempt: a JSON ``POST`` of ``body`` to ``url``, on behalf of ``server``'s
    ``endpoint`` (named in the errors). ``timeout`` bounds the whole attempt,
    ``connect_timeout`` the connection; ``idle_timeout``, if given, every wait for more bytes
    (the answer's headers included): a streamed answer may take long, but never go silent.

    A tuple: built once per attempt on the hot path, at the cost of one tuple."""

    url: str
    body: bytes | bytearray
    headers: Mapping[str, str] | None
    timeout: float
    connect_timeout: float
    server: str
    endpoint: str
    idle_timeout: float | None = None


class RawAnswer(NamedTuple):
    """What a server answered, any status: the body undecoded, ``Retry-After`` as sent."""

    status: int
    body: bytes
    retry_after: str | None = None
    cookies: tuple[tuple[str, str], ...] = ()
    """Cookies the answer set, as (name, value): an environment may keep its session in one.
    Plain strings: they pickle, and nothing of aiohttp's leaves the transport."""


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
    """Sends one attempt. Raises a ``RollgymError`` naming the request's server and endpoint
    when no answer came back (refused, reset, timed out); any answer, a 5xx included, is
    returned."""

    async def send(self, request: Request) -> RawAnswer: ...


class ConnectTimeout(TimeoutError):
    """No connection within ``connect_timeout``."""


class IdleTimeout(TimeoutError):
    """The server sent nothing for ``idle_timeout`` seconds."""


class ConnectFailed(OSError):
    """No connection to ``host``:``port`` (refused, unreachable, no such host)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.host, self.port = host, port


class AnswerCut(ConnectionResetError):
    """The connection closed before the answer was complete."""
