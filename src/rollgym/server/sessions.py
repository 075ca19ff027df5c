"""Per-rollout sessions on an environment: opened by ``/seed_session`` (or ``/reset``), found by
the id a call carries, held within bounds until the rollout ends.

A call names its session in the ``x-rollgym-session`` header or the ``rollgym_session`` cookie
(``rollgym.wire``); the header wins when both are sent. Every answer within a session sets the
cookie again: NeMo Gym's agents carry cookies only, and keep just those of the latest answer.

Sessions never ended (abandoned rollouts) are dropped oldest first past ``MAX_SESSIONS`` or
past ``limits.sessions_bytes`` of their opening bodies; a call naming a dropped session learns
why, and which option keeps more.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollgym.config import ServerLimits
from rollgym.server.endpoint import Call, JSONResponse
from rollgym.wire import SESSION_COOKIE, SESSION_HEADER, session_cookie

MAX_SESSIONS = 200_000
"""Sessions held at most by one server."""


@dataclass
class Session:
    """Per-rollout state, isolated between concurrent rollouts."""

    id: str
    task: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)
    size: int = 0
    """The bytes of its opening body: what it counts against ``limits.sessions_bytes``."""


def new_session(task: dict[str, Any], size: int = 0) -> Session:
    """A session with a fresh random id for task row ``task`` (``size``: its body's bytes)."""
    return Session(id=os.urandom(16).hex(), task=task, size=size)


def session_id(call: Call) -> str | None:
    """The session ``call`` names, if any: its header first, then its cookie."""
    return call.headers.get(SESSION_HEADER) or call.cookies.get(SESSION_COOKIE) or None


def in_session(result: Any, session: Session) -> Any:
    """``result`` answered with ``session``'s cookie set (again); as is without a session."""
    if not session.id:
        return result
    return JSONResponse(result, headers={"set-cookie": session_cookie(session.id)})


class SessionStore(Mapping[str, Session]):
    """The sessions a server holds, by id, oldest first, within their bounds."""

    def __init__(self, server: str, limits: ServerLimits) -> None:
        self.server = server
        self.limits = limits
        self._held: OrderedDict[str, Session] = OrderedDict()
        # Bounded in number and in the bytes of their opening bodies (a parsed row takes a few
        # times its JSON's bytes; what a server adds to ``data`` is not counted).
        self._bytes = 0
        self.dropped = 0
        """Sessions dropped, oldest first, to stay within the bounds."""

    def __getitem__(self, sid: str) -> Session:
        return self._held[sid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, session: Session) -> None:
        """Keep ``session`` until ``release``; drop the oldest past the bounds (those of
        abandoned rollouts, as a rule: a live one ends long before it is oldest)."""
        self._held[session.id] = session
        self._bytes += session.size
        while len(self._held) > 1 and (
            len(self._held) > MAX_SESSIONS or self._bytes > self.limits.sessions_bytes
        ):
            _, oldest = self._held.popitem(last=False)
            self._bytes -= oldest.size
            self.dropped += 1

    def release(self, session: Session) -> None:
        """Forget ``session``: its rollout is over."""
        if self._held.pop(session.id, None) is not None:
            self._bytes -= session.size

    def why_missing(self) -> str:
        """What to add to "unknown session" when sessions were dropped ("" if none were)."""
        if not self.dropped:
            return ""
        return (
            f", or dropped oldest first: {self.dropped} were, to hold at most {MAX_SESSIONS} "
            f"sessions and limits.sessions_bytes = {self.limits.sessions_bytes} bytes of seed "
            f"bodies (raise servers.{self.server}.limits.sessions_bytes)"
        )


__all__ = ["MAX_SESSIONS", "Session", "SessionStore", "in_session", "new_session", "session_id"]
