"""NeMo Gym 0.7's named sessions on resources servers, as a dialect
(``rollgym.server.resources.ResourcesDialect``).

0.7's Environment Servers name the session themselves: ``/seed_session`` with
``{resources_session_id, episode_id, task_id, task_data}`` (``SeedRequest``) opens a named
session for ``task_data`` (seeded by the server's ``seed_session`` hook, as a task row is),
answered ``{resources_session_id, resources_tools: null, sandbox_access: null}`` with rollgym's
session cookie; ``/close_session`` with ``{resources_session_id, episode_id}`` (``CloseRequest``)
ends it. The store's rules for named sessions (``rollgym.server.sessions``) hold: one episode
and task per name, alive until its close, a closed name never opened again.

``/close_session`` also ends the unnamed session the call's cookie or header names (an agent
that gives up frees it at once); on a Gymnasium-style server that is the call's episode.
Listed by the entry points in ``rollgym.dialects``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.routing import BaseRoute, Route

from rollgym.config import format_validation_error
from rollgym.errors import InvalidRequest
from rollgym.nemo_gym.episodes import CREATE_PARAMS, EpisodeId, TaskId
from rollgym.nemo_gym.wire import (
    EPISODE_ID,
    RESOURCES_SESSION_ID,
    RESOURCES_TOOLS,
    SANDBOX_ACCESS,
    TASK_DATA,
)
from rollgym.server.endpoint import Call, json_endpoint
from rollgym.server.sessions import Prepare, Session, SessionName, SessionStore, session_id
from rollgym.wire import CLOSE_SESSION_ENDPOINT

M = TypeVar("M", bound=BaseModel)

MAX_NAME_CHARS = 1024
"""The longest ``resources_session_id`` taken (0.7 names its sessions with 50 characters)."""


class SeedRequest(BaseModel):
    """0.7's ``/seed_session`` body (its ``ResourcesSeedSessionRequest``)."""

    model_config = ConfigDict(extra="forbid")
    resources_session_id: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, Any]

    @property
    def session_name(self) -> SessionName:
        """The session's name as the store keeps it."""
        return SessionName(
            self.resources_session_id,
            self.episode_id.capture_key,  # one key per episode: 0.7 refuses ids ending in -a<N>
            (self.task_id.taskset, self.task_id.task_id),
        )


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
    return {RESOURCES_SESSION_ID: session.name.name, RESOURCES_TOOLS: None, SANDBOX_ACCESS: None}


class NamedSessions:
    """0.7's ``/seed_session`` body and its ``/close_session``."""

    def routes(self, sessions: SessionStore) -> list[BaseRoute]:
        async def close(body: Any, call: Call) -> Any:
            request = parse_close(body)
            name = request.resources_session_id
            sessions.close(name, request.episode_id.capture_key, session_id(call))
            return {RESOURCES_SESSION_ID: name}

        return [Route(CLOSE_SESSION_ENDPOINT, json_endpoint(close), methods=["POST"])]

    def takes(self, body: dict[str, Any]) -> bool:
        return is_named_seed(body)

    async def seed(
        self, body: dict[str, Any], size: int, sessions: SessionStore, prepare: Prepare
    ) -> tuple[Session, dict[str, Any]]:
        request = parse_seed(body)
        session = await sessions.seed_named(request.session_name, request.task_data, size, prepare)
        return session, seeded_answer(session)


RESOURCES_DIALECT = NamedSessions()

__all__ = [
    "MAX_NAME_CHARS",
    "RESOURCES_DIALECT",
    "CloseRequest",
    "NamedSessions",
    "SeedRequest",
    "is_named_seed",
    "parse_close",
    "parse_seed",
    "seeded_answer",
]
