"""Per-rollout sessions on an environment: opened by ``/seed_session`` (or ``/reset``), found by
the id a call carries, held within bounds until the rollout ends.

A call names its session in the ``x-rollgym-session`` header or the ``rollgym_session`` cookie
(``rollgym.wire``); the header wins when both are sent. Every answer within a session sets the
cookie again: some agents carry cookies only, and keep just those of the latest answer.

A dialect (``rollgym.server.resources.ResourcesDialect``) may let the caller name the session
itself (``seed_named``, ``close``). A named session:

- is opened once per name: a repeated seed with the same name and episode answers the same
  session (a seed racing the first one waits for it); another episode or task under that name
  is refused (409);
- lives until its close (not until its ``/verify``: its caller verifies, then closes);
- cannot be opened again once closed: a closed name, seeded or not, is remembered (the last
  ``MAX_CLOSED`` of them, by a 16-byte digest) and a later seed of it is refused (409).

The cookie carries rollgym's own random session id, never the caller's name: a name is any
string, and only the store maps it to its session.

Sessions never ended (abandoned rollouts) are dropped oldest first past ``MAX_SESSIONS`` or
past ``limits.sessions_bytes`` of their opening bodies; a call naming a dropped session learns
why, and which option keeps more.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollgym.config import ServerLimits
from rollgym.errors import InvalidRequest
from rollgym.server.endpoint import Call, JSONResponse
from rollgym.wire import SESSION_COOKIE, SESSION_HEADER, session_cookie

MAX_SESSIONS = 200_000
"""Sessions held at most by one server."""
MAX_CLOSED = MAX_SESSIONS
"""Closed session names remembered at most (oldest forgotten first)."""

Prepare = Callable[["Session"], Awaitable[None]]
"""A server's seed hook: prepares a new session's state before it is handed out."""


@dataclass(frozen=True)
class SessionName:
    """Who opened a named session: the caller's name for it, and the episode and task it is
    for, as its dialect spells them (the same episode and task: equal values)."""

    name: str
    episode: str
    task: tuple[str, ...]
    """The task's id in its parts (messages join them with ``/``)."""


@dataclass
class Session:
    """Per-rollout state, isolated between concurrent rollouts."""

    id: str
    task: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)
    size: int = 0
    """The bytes of its opening body: what it counts against ``limits.sessions_bytes``."""
    name: SessionName | None = None
    """Set when its caller named it (``SessionStore.seed_named``): it then lives until its
    close."""
    seeding: asyncio.Future[None] | None = None
    """Set while its seed runs: a repeated seed waits for it."""


def new_session(task: dict[str, Any], size: int = 0, name: SessionName | None = None) -> Session:
    """A session with a fresh random id for task row ``task`` (``size``: its body's bytes)."""
    return Session(id=os.urandom(16).hex(), task=task, size=size, name=name)


def session_id(call: Call) -> str | None:
    """The session ``call`` names, if any: its header first, then its cookie."""
    return call.headers.get(SESSION_HEADER) or call.cookies.get(SESSION_COOKIE) or None


def in_session(result: Any, session: Session) -> Any:
    """``result`` answered with ``session``'s cookie set (again); as is without a session."""
    if not session.id:
        return result
    return JSONResponse(result, headers={"set-cookie": session_cookie(session.id)})


def _shown(name: str) -> str:
    """A caller's session name as messages show it (a long one cut)."""
    return repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"


def _digest(name: str) -> bytes:
    return hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=16).digest()


# -- the store -------------------------------------------------------------------------------


class SessionStore(Mapping[str, Session]):
    """The sessions a server holds, by id, oldest first, within their bounds."""

    def __init__(self, server: str, limits: ServerLimits) -> None:
        self.server = server
        self.limits = limits
        self._held: OrderedDict[str, Session] = OrderedDict()
        self._named: dict[str, Session] = {}  # a caller's name -> its session
        self._closed: OrderedDict[bytes, None] = OrderedDict()  # digests of closed names
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
        if session.name is not None:
            self._named[session.name.name] = session
        while len(self._held) > 1 and (
            len(self._held) > MAX_SESSIONS or self._bytes > self.limits.sessions_bytes
        ):
            _, oldest = self._held.popitem(last=False)
            self._forget(oldest)
            self.dropped += 1

    def release(self, session: Session) -> None:
        """Forget ``session``: its rollout is over."""
        if self._held.pop(session.id, None) is not None:
            self._forget(session)

    def _forget(self, session: Session) -> None:
        self._bytes -= session.size
        if session.name is not None and self._named.get(session.name.name) is session:
            del self._named[session.name.name]

    def why_missing(self) -> str:
        """What to add to "unknown session" when sessions were dropped ("" if none were)."""
        if not self.dropped:
            return ""
        return (
            f", or dropped oldest first: {self.dropped} were, to hold at most {MAX_SESSIONS} "
            f"sessions and limits.sessions_bytes = {self.limits.sessions_bytes} bytes of seed "
            f"bodies (raise servers.{self.server}.limits.sessions_bytes)"
        )

    # -- named sessions ------------------------------------------------------------------------

    async def seed_named(
        self, name: SessionName, task: dict[str, Any], size: int, prepare: Prepare
    ) -> Session:
        """The session ``name`` names: the one already open under ``name.name`` (same episode
        and task, else 409), or a new one for task row ``task``, held once ``prepare`` (the
        server's seed hook) has run on it. A closed name is refused (409)."""
        while (open_ := self._named.get(name.name)) is not None:
            _same_episode(open_, name.episode, name.task)
            if open_.seeding is None:
                return open_
            # The first seed of this name still runs (this is a retry of it): its outcome is
            # ours. ``shield``: a waiter that goes away must not cancel the first seed.
            await asyncio.shield(open_.seeding)
        if _digest(name.name) in self._closed:
            raise InvalidRequest(
                f"resources session {_shown(name.name)} is closed: a closed session is not "
                "seeded again (name a new one)",
                status=409,
            )
        session = new_session(task, size, name)
        session.seeding = asyncio.get_running_loop().create_future()
        self.hold(session)  # holds the name while the hook runs
        try:
            await prepare(session)
        except BaseException:
            self.release(session)
            raise
        finally:
            session.seeding.set_result(None)
            session.seeding = None
        if self._named.get(name.name) is not session:
            raise InvalidRequest(
                f"resources session {_shown(name.name)} was closed (or dropped"
                f"{self.why_missing()}) while it was being seeded",
                status=409,
            )
        return session

    def close(self, name: str, episode: str, caller: str | None = None) -> Session | None:
        """End the session named ``name`` (and remember the name as closed, seeded or not, so
        that no late seed opens it); also the unnamed session ``caller`` (the call's session
        id) names, if it is held. The session ended, if any; an unknown or closed name is no
        error. Another episode's session is refused (409) and kept."""
        named = self._named.get(name)
        if named is not None:
            _same_episode(named, episode, None)
        digest = _digest(name)
        self._closed[digest] = None
        self._closed.move_to_end(digest)
        while len(self._closed) > MAX_CLOSED:
            self._closed.popitem(last=False)
        if named is not None:
            self.release(named)
            return named
        unnamed = self._held.get(caller) if caller else None
        if unnamed is not None and unnamed.name is None:
            self.release(unnamed)
            return unnamed
        return None


def _same_episode(session: Session, episode: str, task: tuple[str, ...] | None) -> None:
    assert session.name is not None
    seeded = session.name
    if seeded.episode != episode:
        what = f"episode {seeded.episode!r}, not {episode!r}"
    elif task is not None and seeded.task != task:
        what = f"task {'/'.join(seeded.task)}"
    else:
        return
    raise InvalidRequest(
        f"resources session {_shown(seeded.name)} is open for {what}: a session name belongs "
        "to one episode",
        status=409,
    )


__all__ = [
    "MAX_CLOSED",
    "MAX_SESSIONS",
    "Prepare",
    "Session",
    "SessionName",
    "SessionStore",
    "in_session",
    "new_session",
    "session_id",
]
