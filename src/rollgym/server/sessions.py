"""Per-rollout sessions on an environment: opened by ``/seed_session`` (or ``/reset``), found by
the id a call carries, held within bounds until the rollout ends.

A call names its session in the ``x-rollgym-session`` header or the ``rollgym_session`` cookie
(``rollgym.wire``); the header wins when both are sent. Every answer within a session sets the
cookie again: NeMo Gym's agents carry cookies only, and keep just those of the latest answer.

NeMo Gym 0.7's Environment Servers name the session themselves: ``/seed_session`` with
``{resources_session_id, episode_id, task_id, task_data}`` (``SeedRequest``) opens a *named*
session, and ``/close_session`` with ``{resources_session_id, episode_id}`` (``CloseRequest``)
ends it. A named session:

- is opened once per name: a repeated seed with the same name and episode answers the same
  session (a seed racing the first one waits for it); another episode or task under that name
  is refused (409);
- lives until its close (not until its ``/verify``: 0.7 verifies, then closes);
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
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollgym.config import ServerLimits, format_validation_error
from rollgym.errors import InvalidRequest
from rollgym.nemo_gym.episodes import CREATE_PARAMS, EpisodeId, TaskId
from rollgym.server.endpoint import Call, JSONResponse
from rollgym.wire import (
    EPISODE_ID,
    RESOURCES_SESSION_ID,
    RESOURCES_TOOLS,
    SANDBOX_ACCESS,
    SESSION_COOKIE,
    SESSION_HEADER,
    TASK_DATA,
    session_cookie,
)

M = TypeVar("M", bound=BaseModel)

MAX_SESSIONS = 200_000
"""Sessions held at most by one server."""
MAX_CLOSED = MAX_SESSIONS
"""Closed session names remembered at most (oldest forgotten first)."""
MAX_NAME_CHARS = 1024
"""The longest ``resources_session_id`` taken (0.7 names its sessions with 50 characters)."""


@dataclass(frozen=True)
class SessionName:
    """Who opened a named session: the caller's name for it, and the episode it is for."""

    resources_session_id: str
    episode_id: EpisodeId
    task_id: TaskId


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
    """Set when 0.7's seed opened it: it then lives until ``/close_session``."""
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


# -- NeMo Gym 0.7's session bodies -----------------------------------------------------------


class SeedRequest(BaseModel):
    """0.7's ``/seed_session`` body (its ``ResourcesSeedSessionRequest``)."""

    model_config = ConfigDict(extra="forbid")
    resources_session_id: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, Any]


class CloseRequest(BaseModel):
    """0.7's ``/close_session`` body (its ``ResourcesCloseSessionRequest``)."""

    model_config = ConfigDict(extra="forbid")
    resources_session_id: str = Field(max_length=MAX_NAME_CHARS)
    episode_id: EpisodeId


def is_named_seed(body: dict[str, Any]) -> bool:
    """Whether a ``/seed_session`` body is 0.7's (else a task row): it has
    ``resources_session_id``, or it has ``episode_id`` or ``task_data`` and no
    ``responses_create_params`` (which every task row has). Unlike 0.7, which takes a malformed
    one for a task row, such a body is then validated as 0.7's and refused if it is not."""
    if RESOURCES_SESSION_ID in body:
        return True
    return CREATE_PARAMS not in body and (EPISODE_ID in body or TASK_DATA in body)


def parse_seed(body: Any) -> SeedRequest:
    return _parse(SeedRequest, body, "seed_session")


def parse_close(body: Any) -> CloseRequest:
    return _parse(CloseRequest, body, "close_session")


def _parse(model: type[M], body: Any, endpoint: str) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message = format_validation_error(endpoint, exc, one_line=True, model=model)
        raise InvalidRequest(message, status=422) from None


def seeded_answer(session: Session) -> dict[str, Any]:
    """0.7's answer to the seed that opened the named ``session``."""
    assert session.name is not None
    return {
        RESOURCES_SESSION_ID: session.name.resources_session_id,
        RESOURCES_TOOLS: None,
        SANDBOX_ACCESS: None,
    }


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
        self._named: dict[str, Session] = {}  # resources_session_id -> its session
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
            self._named[session.name.resources_session_id] = session
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
        if (
            session.name is not None
            and self._named.get(session.name.resources_session_id) is session
        ):
            del self._named[session.name.resources_session_id]

    def why_missing(self) -> str:
        """What to add to "unknown session" when sessions were dropped ("" if none were)."""
        if not self.dropped:
            return ""
        return (
            f", or dropped oldest first: {self.dropped} were, to hold at most {MAX_SESSIONS} "
            f"sessions and limits.sessions_bytes = {self.limits.sessions_bytes} bytes of seed "
            f"bodies (raise servers.{self.server}.limits.sessions_bytes)"
        )

    # -- named sessions (0.7) -----------------------------------------------------------------

    async def seed_named(
        self, request: SeedRequest, size: int, prepare: Callable[[Session], Awaitable[None]]
    ) -> Session:
        """The session named by ``request``: the one already open under its name (same
        episode and task, else 409), or a new one for ``request.task_data``, held once
        ``prepare`` (the server's seed hook) has run on it. A closed name is refused (409)."""
        name = request.resources_session_id
        while (open_ := self._named.get(name)) is not None:
            _same_episode(open_, request.episode_id, request.task_id)
            if open_.seeding is None:
                return open_
            # The first seed of this name still runs (this is a retry of it): its outcome is
            # ours. ``shield``: a waiter that goes away must not cancel the first seed.
            await asyncio.shield(open_.seeding)
        if _digest(name) in self._closed:
            raise InvalidRequest(
                f"resources session {_shown(name)} is closed: a closed session is not seeded "
                "again (name a new one)",
                status=409,
            )
        label = SessionName(name, request.episode_id, request.task_id)
        session = new_session(request.task_data, size, label)
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
        if self._named.get(name) is not session:
            raise InvalidRequest(
                f"resources session {_shown(name)} was closed (or dropped{self.why_missing()}) "
                "while it was being seeded",
                status=409,
            )
        return session

    def close(self, request: CloseRequest, caller: str | None = None) -> Session | None:
        """End the session named by ``request`` (and remember the name as closed, seeded or
        not, so that no late seed opens it); also the unnamed session ``caller`` (the call's
        session id) names, if it is held. The session ended, if any; an unknown or closed
        name is no error. Another episode's session is refused (409) and kept."""
        name = request.resources_session_id
        named = self._named.get(name)
        if named is not None:
            _same_episode(named, request.episode_id, None)
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


def _same_episode(session: Session, episode: EpisodeId, task: TaskId | None) -> None:
    assert session.name is not None
    seeded = session.name
    if seeded.episode_id != episode:
        what = f"episode {seeded.episode_id.capture_key!r}, not {episode.capture_key!r}"
    elif task is not None and seeded.task_id != task:
        what = f"task {seeded.task_id.taskset}/{seeded.task_id.task_id}"
    else:
        return
    raise InvalidRequest(
        f"resources session {_shown(seeded.resources_session_id)} is open for {what}: a "
        "session name belongs to one episode",
        status=409,
    )


__all__ = [
    "MAX_CLOSED",
    "MAX_NAME_CHARS",
    "MAX_SESSIONS",
    "CloseRequest",
    "SeedRequest",
    "Session",
    "SessionName",
    "SessionStore",
    "in_session",
    "is_named_seed",
    "new_session",
    "parse_close",
    "parse_seed",
    "seeded_answer",
    "session_id",
]
