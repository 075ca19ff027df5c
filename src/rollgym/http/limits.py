"""How much of one answer a caller reads: the limits of the attempt in flight, and the checks.

The caps (``AnswerLimits``) belong to the called server's policy (``retry.answer_limits``).
The client sets them for each attempt it sends (``sending``); a transport reads them
(``current``) and checks them where bytes arrive, as integer comparisons on counts it keeps
anyway. A context variable rather than a parameter: ``Transport.send`` stays the narrow seam
it is, and a transport that wraps another (the agent's hop counter, the in-process one)
passes them on untouched.

Past a limit, the transport stops reading, closes the connection and raises ``OverLimit``,
which ``rollgym.http.translate`` turns into ``AnswerTooLarge``.
"""

from __future__ import annotations

import zlib
from contextvars import ContextVar, Token

from rollgym.config import AnswerLimits


class Caps:
    """``AnswerLimits`` as plain integers, for the checks on every chunk and header: an
    attribute of a pydantic model costs several times one of these slots."""

    __slots__ = ("body_bytes", "decompressed_bytes", "header_bytes", "headers")

    def __init__(self, limits: AnswerLimits) -> None:
        self.body_bytes = limits.body_bytes
        self.decompressed_bytes = limits.decompressed_bytes
        self.header_bytes = limits.header_bytes
        self.headers = limits.headers


DEFAULT_LIMITS = AnswerLimits()
DEFAULT_CAPS = Caps(DEFAULT_LIMITS)

_CURRENT: ContextVar[Caps] = ContextVar("rollgym_answer_limits")


def current(default: Caps = DEFAULT_CAPS) -> Caps:
    """The limits of the attempt being sent (``default`` when no client set any)."""
    return _CURRENT.get(default)


def sending(caps: Caps) -> Token[Caps]:
    """Set ``caps`` for the attempt about to be sent; ``done`` with the token after it."""
    return _CURRENT.set(caps)


def done(token: Token[Caps]) -> None:
    _CURRENT.reset(token)


class OverLimit(Exception):
    """An answer went past ``answer_limits.<limit>`` (``allowed``): ``seen`` is how much had
    come when reading stopped, ``status`` the answer's status if its headers were read."""

    def __init__(self, limit: str, allowed: int, seen: int, status: int | None = None) -> None:
        super().__init__(f"answer_limits.{limit} = {allowed} exceeded ({seen} or more)")
        self.limit, self.allowed, self.seen, self.status = limit, allowed, seen, status


class Undecodable(ValueError):
    """A compressed body that does not decode (a protocol error of the server's)."""


DECODABLE = (b"gzip", b"x-gzip", b"deflate")
"""The ``Content-Encoding`` values both transports decode (and all they ask for)."""


def decompress(body: bytes, encoding: bytes, limit: int, status: int | None = None) -> bytes:
    """``body`` decoded from ``encoding`` (one of ``DECODABLE``), never more than ``limit``
    bytes of output held: past it, ``OverLimit``. A body that does not decode: ``Undecodable``."""
    # 32 + 15: a zlib or gzip header, detected; raw deflate (no header) as some servers send it.
    for wbits in (47, -15) if encoding == b"deflate" else (47,):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            raise OverLimit("decompressed_bytes", limit, len(out), status)
        if not inflater.eof:
            raise Undecodable(f"truncated {encoding.decode('latin-1')!r} body")
        return out
    raise Undecodable(f"undecodable {encoding.decode('latin-1')!r} body")
