"""Agent sessions (NeMo Gym 0.7): an Environment Server seeds the resources, then has an agent
take one turn against them, and verifies the turn itself (``single_agent_turn``)::

    POST /v1/agent_sessions        {agent_session_id, episode_id, task_id, tool_accesses,
                                    sandbox_access}     -> {agent_session_id} + session cookie
    POST [/ng-rollout/<id>[/training-token-capture]]/v1/responses   (with the cookie)
                                   create params        -> the turn's Responses API response
    POST /v1/agent_sessions/close  {agent_session_id, episode_id}
                                   -> {agent_session_id, agent_observations, resources_cookies}

A turn is the agent's own loop (``AgentServer.turn``): model calls through the agent's model
server (at its token-capture path when the turn came at one), tool calls to the granted resources only (a ``direct_http`` access: ``POST
{base_url}/{tool}`` with its cookies and headers), no seed and no verify. The close answers the
granted session's cookie jar as the turn left it (``null`` when nothing was granted), which the
Environment Server verifies with.

The rules are 0.7's: an identical seed again is 200; 409 for an id bound to another seed, a
cookie naming another session (or one this agent no longer holds), a seed after close, a turn
in a closed or unknown session, and a close naming another episode; a repeated close answers
the same body; a close of an unknown id answers nulls and blocks a later seed of that id.
Sessions are this process's only (one agent process, as 0.7 requires ``num_workers: 1``),
never shared between rollouts, and held within the resources store's bounds (oldest dropped,
closed receipts included: a close retried after its receipt was dropped seeds nothing again).

Where rollgym differs: ids are bounded (``agent_episodes.MAX_ID_CHARS``); only ``direct_http``
accesses are taken (at most one; an optional MCP access is skipped, a required one, or any sandbox, is a 422
naming it); a grant's header names and cookie values must be sendable as they are (422).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol, TypeVar

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.config import RetryPolicy, format_validation_error, kind_defaults
from rollgym.errors import HTTPStatusError, InvalidRequest
from rollgym.http import Target
from rollgym.nemo_gym.agent_episodes import MAX_ID_CHARS, check_ids
from rollgym.nemo_gym.episodes import EpisodeId, TaskId
from rollgym.nemo_gym.wire import (
    AGENT_OBSERVATIONS,
    AGENT_SESSION_COOKIE,
    AGENT_SESSION_ID,
    AGENT_SESSIONS_CLOSE_ENDPOINT,
    AGENT_SESSIONS_ENDPOINT,
    DIRECT_HTTP,
    RESOURCES_COOKIES,
)
from rollgym.protocol import ResponsesCreateParams
from rollgym.server.base import ServerContext
from rollgym.server.endpoint import Call, JSONResponse, json_endpoint
from rollgym.server.episode import Grant, ResourcesClient
from rollgym.server.model import RESPONSES_ENDPOINT
from rollgym.server.sessions import Session, SessionStore
from rollgym.server.versions import CallVersions
from rollgym.wire import ROLLOUT_ID_PATTERN

log = logging.getLogger("rollgym.server")

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header or cookie name
_COOKIE_VALUE = re.compile(r'^[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*$|^"[^"\\\x00-\x1f]*"$')
_HEADER_VALUE = re.compile(r"^[^\x00-\x08\x0a-\x1f\x7f]*$")
_OWN_HEADERS = frozenset(
    {"cookie", "host", "content-length", "content-type", "transfer-encoding", "connection"}
)
"""Headers the agent sets itself: a grant may not send its own (cookies go in ``cookies``)."""


class DirectHTTPAccess(BaseModel):
    """0.7's ``DirectHTTPToolAccess``: tools at ``POST {base_url}/{tool}``."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["direct_http"] = "direct_http"
    name: str = Field(min_length=1, max_length=MAX_ID_CHARS, pattern=ROLLOUT_ID_PATTERN)
    required: bool
    base_url: AnyHttpUrl
    cookies: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("cookies")
    @classmethod
    def _sendable_cookies(cls, cookies: dict[str, str]) -> dict[str, str]:
        for name, value in cookies.items():
            if not _TOKEN.match(name) or not _COOKIE_VALUE.match(value):
                raise ValueError(f"cookie {name[:64]!r} cannot be sent as a cookie as it is")
        return cookies

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _TOKEN.match(name) or not _HEADER_VALUE.match(value):
                raise ValueError(f"header {name[:64]!r} cannot be sent as it is")
            if name.lower() in _OWN_HEADERS:
                raise ValueError(f"header {name!r} is the agent's own (give cookies in cookies)")
        return headers


class MCPAccess(BaseModel):
    """0.7's ``MCPToolAccess`` (read to say it is unsupported, or skip it when optional)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["mcp"] = "mcp"
    name: str = Field(min_length=1, max_length=MAX_ID_CHARS, pattern=ROLLOUT_ID_PATTERN)
    required: bool
    connection: dict[str, Any]


ToolAccess = Annotated[DirectHTTPAccess | MCPAccess, Field(discriminator="kind")]


class AgentSessionSeed(BaseModel):
    """0.7's ``AgentSeedSessionRequest``."""

    model_config = ConfigDict(extra="forbid")
    agent_session_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    episode_id: EpisodeId
    task_id: TaskId
    tool_accesses: list[ToolAccess] = Field(default_factory=list)
    sandbox_access: dict[str, Any] | None = None

    @field_validator("tool_accesses")
    @classmethod
    def _unique_names(cls, accesses: list[DirectHTTPAccess | MCPAccess]) -> list[Any]:
        names = [a.name for a in accesses]
        if len(names) != len(set(names)):
            raise ValueError("tool access names must be unique within an agent session")
        return accesses


class AgentSessionClose(BaseModel):
    """0.7's ``AgentCloseSessionRequest``."""

    model_config = ConfigDict(extra="forbid")
    agent_session_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    episode_id: EpisodeId


@dataclass
class AgentSession(Session):
    """One agent session: ``task`` is its seed request (JSON), to tell a retry from a rebind."""

    episode_id: EpisodeId | None = None
    grant: Grant | None = None
    receipt: dict[str, Any] | None = None
    """The close's answer, once closed (a repeated close answers it again)."""
    versions: CallVersions = field(default_factory=CallVersions)
    """The policy versions of the session's model calls, over all its turns: a turn's first
    call already tells the model server how old the rollout is (bounded staleness)."""


class SessionAgent(Protocol):
    """What the sessions need of their agent (``rollgym.server.agent.AgentServer``)."""

    name: str
    ctx: ServerContext

    def takes_turns(self) -> bool: ...

    async def take_turn(
        self,
        params: dict[str, Any],
        rollout: str | None,
        grant: Grant | None,
        *,
        token_capture: bool = False,
        versions: CallVersions | None = None,
    ) -> dict[str, Any]: ...

    def granted_client(self, target: Target) -> ResourcesClient: ...


class AgentSessions:
    """The agent-session endpoints of one agent server, and the sessions it holds."""

    def __init__(self, agent: SessionAgent) -> None:
        self.agent = agent
        self.store = SessionStore(agent.name, agent.ctx.config.limits)

    def routes(self) -> list[BaseRoute]:
        """The endpoints at their plain paths: the app serves 0.7's ``/ng-rollout/<id>/...``
        (and ``.../training-token-capture/...``) paths as these (``rollgym.server.app``)."""
        return [
            Route(AGENT_SESSIONS_ENDPOINT, json_endpoint(self.seed), methods=["POST"]),
            Route(AGENT_SESSIONS_CLOSE_ENDPOINT, json_endpoint(self.close), methods=["POST"]),
            Route(RESPONSES_ENDPOINT, json_endpoint(self.responses), methods=["POST"]),
        ]

    # -- the endpoints -------------------------------------------------------------------

    async def seed(self, body: Any, call: Call) -> Response:
        seed = _parse(AgentSessionSeed, body, AGENT_SESSIONS_ENDPOINT)
        check_ids(seed.episode_id, seed.task_id, AGENT_SESSIONS_ENDPOINT, task_at="task_id")
        sid = seed.agent_session_id
        current = _cookie_session(call)
        if current is not None and current != sid:
            raise _conflict("agent_session_id does not match the session cookie")
        request = seed.model_dump(mode="json")
        held = self._get(sid)
        if held is not None:
            if held.receipt is not None:
                raise _conflict("Agent session is already closed")
            if held.task != request:
                raise _conflict("agent_session_id is already bound to another seed request")
            return _answer({AGENT_SESSION_ID: sid}, sid)  # a retry: the same session
        if current is not None:
            raise _conflict(f"Agent session cookie has expired{self.store.why_missing()}")
        if not self.agent.takes_turns():
            raise HTTPStatusError(
                f"{type(self.agent).__name__} does not take agent-session turns (it has no "
                "turn(): a Gymnasium-style agent plays /reset and /step, not tools); use its "
                "/run instead",
                status=501,
            )
        session = AgentSession(
            id=sid, task=request, size=call.size, episode_id=seed.episode_id,
            grant=self._grant(seed),
        )  # fmt: skip
        self.store.hold(session)
        return _answer({AGENT_SESSION_ID: sid}, sid)

    async def responses(self, body: Any, call: Call) -> Response:
        _parse(ResponsesCreateParams, body, RESPONSES_ENDPOINT)  # the loop takes the body itself
        sid = _cookie_session(call)
        if sid is None:
            # No session: a turn against the agent's own resources server, unseeded (what
            # 0.7's agents do for a bare /v1/responses).
            response = await self.agent.take_turn(
                body, call.rollout, None, token_capture=call.token_capture
            )
            return JSONResponse(response)
        session = self._get(sid)
        if session is None or session.receipt is not None:
            why = self.store.why_missing() if session is None else ""
            raise _conflict(f"Unknown or closing agent_session_id{why}")
        assert session.episode_id is not None
        grant = session.grant or Grant(None)
        response = await self.agent.take_turn(
            body, session.episode_id.capture_key, grant, token_capture=call.token_capture,
            versions=session.versions,
        )  # fmt: skip
        return _answer(response, sid)

    async def close(self, body: Any, call: Call) -> Response:
        close = _parse(AgentSessionClose, body, AGENT_SESSIONS_CLOSE_ENDPOINT)
        check_ids(close.episode_id, None, AGENT_SESSIONS_CLOSE_ENDPOINT)
        sid = close.agent_session_id
        current = _cookie_session(call)
        if current is not None and current != sid:
            raise _conflict("agent_session_id does not match the session cookie")
        session = self._get(sid)
        if session is not None and session.episode_id != close.episode_id:
            raise _conflict("episode_id does not match the seeded agent session")
        if session is not None and session.receipt is not None:
            return _answer(session.receipt, sid)
        if session is None and current is not None:
            raise _conflict(f"Agent close receipt has expired{self.store.why_missing()}")
        grant = session.grant if session is not None else None
        jar = dict(grant.cookies) if grant is not None and grant.resources is not None else None
        receipt = {AGENT_SESSION_ID: sid, AGENT_OBSERVATIONS: None, RESOURCES_COOKIES: jar}
        if session is not None:
            self.store.release(session)
        # Kept as a receipt (the newest, counted by its cookies' bytes): a repeated close
        # answers it, a late seed of the id is refused.
        size = sum(len(k) + len(v) for k, v in (jar or {}).items())
        receipt_held = AgentSession(
            id=sid, task={}, size=size, episode_id=close.episode_id, receipt=receipt
        )
        self.store.hold(receipt_held)
        return _answer(receipt, sid)

    # -- helpers -------------------------------------------------------------------------

    def _get(self, sid: str) -> AgentSession | None:
        session = self.store.get(sid)
        return session if isinstance(session, AgentSession) else None

    def _grant(self, seed: AgentSessionSeed) -> Grant:
        """The resources the seed grants, or a 422 naming what this agent cannot use."""
        if seed.sandbox_access is not None:
            raise _unsupported("sandbox_access (this agent runs no sandbox)")
        direct = [a for a in seed.tool_accesses if isinstance(a, DirectHTTPAccess)]
        for access in seed.tool_accesses:
            if isinstance(access, MCPAccess):
                if access.required:
                    raise _unsupported(
                        f"required MCP tool access {access.name!r} (only {DIRECT_HTTP} tool "
                        "accesses are)"
                    )
                log.info("agent session %s: optional MCP access %r skipped",
                         seed.agent_session_id, access.name)  # fmt: skip
        if len(direct) > 1:
            names = ", ".join(repr(a.name) for a in direct)
            raise _unsupported(f"more than one {DIRECT_HTTP} tool access ({names}): give one")
        if not direct:
            return Grant(None)
        access = direct[0]
        url = str(access.base_url).rstrip("/")
        # The configured resources server's policy when the grant is on it (the usual case:
        # the environment server fronts the same one); else a resources server's defaults.
        policy = next(
            (t.policy for t in self.agent.ctx.peers.values() if url in t.urls),
            None,
        ) or RetryPolicy.model_validate(kind_defaults("resources"))
        # One target per (grant name, URL): its breaker and budget are that server's, and the
        # client holds as many as there are distinct grants, not one per session.
        target = Target(f"{access.name}@{url}", (url,), policy)
        resources = self.agent.granted_client(target)
        return Grant(resources, dict(access.cookies), dict(access.headers))


M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], body: Any, endpoint: str) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message = format_validation_error(f"{endpoint}: invalid request", exc, one_line=True)
        raise InvalidRequest(message, status=422) from None


def _conflict(message: str) -> InvalidRequest:
    return InvalidRequest(message, status=409)


def _unsupported(what: str) -> InvalidRequest:
    return InvalidRequest(f"{AGENT_SESSIONS_ENDPOINT}: not supported: {what}", status=422)


def _cookie_session(call: Call) -> str | None:
    """The agent session the call's cookie names (``None``: no cookie)."""
    raw = call.cookies.get(AGENT_SESSION_COOKIE)
    if raw is None:
        return None
    try:
        sid = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise _conflict("Invalid agent session marker") from None
    if not sid:
        raise _conflict("Invalid agent session marker")
    return sid


def _answer(payload: Any, sid: str) -> JSONResponse:
    """``payload`` with the session's cookie set (again), as 0.7's session middleware does."""
    value = base64.urlsafe_b64encode(sid.encode()).decode().rstrip("=")
    cookie = f"{AGENT_SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=lax"
    return JSONResponse(payload, headers={"set-cookie": cookie})


__all__ = [
    "AGENT_SESSION_COOKIE",
    "AgentSession",
    "AgentSessionClose",
    "AgentSessionSeed",
    "AgentSessions",
    "DirectHTTPAccess",
    "MCPAccess",
]
