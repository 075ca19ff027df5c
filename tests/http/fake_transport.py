"""A transport that answers from a script, with no sockets: for the client's retry logic.

Each step of the script is what one attempt gets: a ``RawAnswer`` (or a bare status), or a
``Fail`` (the error the transport raises, built with the attempt's server, endpoint and URL, as
``rollgym.http.translate`` would). ``sent`` records every attempt and ``raised`` every error
object handed to the client, so tests can check that the client never hands them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from rollgym.errors import RollgymError
from rollgym.http.transport import RawAnswer, Request


@dataclass(frozen=True)
class Fail:
    """The transport raises ``kind(message, ...)`` for this attempt."""

    kind: type[RollgymError]
    message: str = "scripted failure"
    body: str | None = None


@dataclass(frozen=True)
class Sent:
    url: str
    body: bytes
    headers: dict[str, str]
    timeout: float
    connect_timeout: float
    idle_timeout: float | None = None


Step = RawAnswer | Fail | int


def ok(hit: int = 0) -> bytes:
    return orjson.dumps({"ok": True, "hit": hit})


@dataclass
class FakeTransport:
    script: list[Step] = field(default_factory=list)
    default: Step = 200
    sent: list[Sent] = field(default_factory=list)
    raised: list[RollgymError] = field(default_factory=list)

    async def send(self, request: Request) -> RawAnswer:
        url, body, headers, timeout, connect_timeout, server, endpoint, idle_timeout = request
        self.sent.append(
            Sent(url, bytes(body), dict(headers or {}), timeout, connect_timeout, idle_timeout)
        )
        step = self.script.pop(0) if self.script else self.default
        if isinstance(step, Fail):
            err = step.kind(
                step.message, body=step.body, server=server, endpoint=endpoint, url=url,
                method="POST",
            )  # fmt: skip
            self.raised.append(err)
            raise err
        if isinstance(step, int):
            return RawAnswer(step, ok(len(self.sent)) if step < 400 else b"{}")
        return step

    def urls(self) -> list[str]:
        return [s.url for s in self.sent]
