"""Gymnasium-style environments: ``POST /reset`` + ``POST /step``, the ``GymnasiumServer``
protocol, so rollgym's ``gymnasium_agent`` and NeMo Gym's own can play them.

Writing one takes one small class; the episode's state lives in ``session.data``::

    class Countdown(GymnasiumServer):
        row_fields = frozenset({"start"})

        async def reset(self, session: Session) -> Reset:
            session.data["left"] = session.task["start"]
            return Reset("Say 'go' until I stop you.")

        async def step(self, session: Session, response: dict) -> Step:
            session.data["left"] -= 1
            done = session.data["left"] == 0
            return Step(None if done else "Again.", 1.0 if done else 0.0, terminated=done)

``/reset`` takes the task row (``session.task``) and opens the episode's session; ``/step``
takes the row plus ``response`` (the model's answer). The session travels as for a
``ResourcesServer`` and is held in the same store (``rollgym.server.sessions``): its cookie is
set again on every answer, and it ends with the step that says ``terminated`` or
``truncated``. A step naming no open episode is answered 404.

The dialects' endpoints (``rollgym.server.resources.ResourcesDialect.routes``) serve its store
too: a close ends the episode the call's session names before it is over (an agent that gives
up frees it at once). ``GET /reverify_mode`` answers ``"unsupported"``: a
step's reward comes from the episode's state, which a recorded rollout does not carry.
``GET /fingerprint`` answers what scores its episodes, taken at start as for a resources server
(its package's code and data, its declared ``version``: ``rollgym.server.fingerprint``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

from starlette.routing import BaseRoute, Route

from rollgym.errors import InternalError, InvalidRequest
from rollgym.protocol import Reset, Step
from rollgym.server.base import BaseServer, ServerContext
from rollgym.server.endpoint import BodyLimit, Call, json_endpoint
from rollgym.server.fingerprint import Fingerprint, fingerprint_route
from rollgym.server.resources import ReverifyMode, dialects_of
from rollgym.server.sessions import Session, SessionStore, in_session, new_session, session_id
from rollgym.wire import REVERIFY_MODE_ENDPOINT


class GymnasiumServer(BaseServer):
    """Base class of a Gymnasium-style environment. Override ``step``, and ``reset`` unless the
    episode starts without an observation; declare the row fields it reads in ``row_fields``."""

    kind: ClassVar[str] = "resources"
    reverify_mode: ClassVar[ReverifyMode] = "unsupported"
    version: ClassVar[str | None] = None
    """The environment's declared version, part of its fingerprint (``GET /fingerprint``)."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self._sessions = SessionStore(self.name, ctx.config.limits)
        # Only the dialects' endpoints: a Gymnasium-style episode opens at ``/reset`` alone.
        self._dialect_routes = [r for d in dialects_of(ctx) for r in d.routes(self._sessions)]
        # Once, at start: what scores its episodes, as for a resources server.
        self.fingerprint = Fingerprint.of(type(self), self.data_files(), type(self).version)

    # -- the authoring API ---------------------------------------------------------------

    async def reset(self, session: Session) -> Reset:
        """Start the episode of ``session.task``; the observation the model sees first."""
        return Reset(None)

    async def step(self, session: Session, response: dict[str, Any]) -> Step:
        """Act on the model's ``response``: the step's reward, and whether the episode ended."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def data_files(self) -> list[tuple[str, Path]] | None:
        """The data files this environment scores with, as (name, path), digested into its
        fingerprint at start; None (the default): the non-Python files of its package's
        folder (``rollgym.server.fingerprint``)."""
        return None

    @property
    def open_episodes(self) -> int:
        """Episodes reset and not yet ended (nor dropped)."""
        return len(self._sessions)

    # -- transport -----------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        limits = self.ctx.config.limits
        limit = BodyLimit(limits.seed_bytes, f"servers.{self.name}.limits.seed_bytes")
        return [
            Route("/reset", json_endpoint(self._reset, limit), methods=["POST"]),
            Route("/step", json_endpoint(self._step), methods=["POST"]),
            *self._dialect_routes,
            Route(REVERIFY_MODE_ENDPOINT, json_endpoint(self._reverify_mode), methods=["GET"]),
            fingerprint_route(self.fingerprint),
        ]

    async def _reverify_mode(self, body: Any, call: Call) -> Any:
        return type(self).reverify_mode

    async def _reset(self, row: Any, call: Call) -> Any:
        if not isinstance(row, dict):
            raise InvalidRequest("/reset expects the task row as a JSON object", status=422)
        session = new_session(row, call.size)
        reset = await self.reset(session)
        if not isinstance(reset, Reset):
            raise InternalError(f"{type(self).__name__}.reset returned no Reset")
        self._sessions.hold(session)
        return in_session(reset.to_dict(), session)

    async def _step(self, body: Any, call: Call) -> Any:
        sid = session_id(call)
        session = self._sessions.get(sid or "")
        if session is None:
            raise InvalidRequest(
                f"no episode for session {sid!r} (never reset, over, or closed"
                f"{self._sessions.why_missing()})",
                status=404,
            )
        response = body.get("response") if isinstance(body, dict) else None
        if not isinstance(response, dict):
            raise InvalidRequest("/step expects the task row plus a 'response' object", status=422)
        step = await self.step(session, response)
        if not (isinstance(step, Step) and math.isfinite(step.reward)):
            raise InternalError(f"{type(self).__name__}.step returned no Step with a finite reward")
        if step.terminated or step.truncated:
            self._sessions.release(session)  # the episode is over: a later step is a 404
        return in_session(step.to_dict(), session)


__all__ = ["GymnasiumServer", "Reset", "Session", "Step"]
