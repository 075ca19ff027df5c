"""Model servers: OpenAI-compatible ``POST /v1/responses`` from one hook.

    class Parrot(ModelServer):
        async def respond(self, params: dict, call: Call) -> dict:
            return build_response(...)   # a Responses API response object

The base reads and checks the body (a JSON object), cancels the work if the caller goes away,
and answers errors with rollgym's error body. ``call.rollout`` names the rollout, so replies
can be deterministic per rollout. Other endpoints (chat completions, ``GET /v1/models``,
vLLM's ``POST /tokenize``) are added in ``routes``.

Every model call runs through the server's ``policy`` gate (``rollgym.server.policy``): held
while a trainer pauses the server for a weight update, re-issued if the pause aborted it,
refused if its rollout is too stale; its answer records the policy version, the replica and any
aborted versions (``rollgym.server.versions``). ``respond`` never sees ``"stream": true``: the
base streams the stamped answer itself. The gate's endpoints (``policy_routes``)::

    GET  /rollgym/policy   {"version", "paused", "max_staleness", "in_flight", "held"} (POST too)
    POST /rollgym/pause    {"abort": false, "timeout_s": 300}
                           -> {"version", "paused", "aborted", "held", "in_flight"}
    POST /rollgym/resume   {"version": N, "max_staleness": K | null}
                           -> {"version", "paused": false, "max_staleness", "released"}

A pause or resume changes what every caller is served, so it needs the control token
(``rollgym.control_token``: ``Authorization: Bearer``; 401 without it, 403 with another);
``controlled`` guards a server's own endpoints of that kind the same way.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.config import format_validation_error
from rollgym.control_token import control_token, require
from rollgym.errors import InvalidRequest
from rollgym.server.base import BaseServer, ServerContext
from rollgym.server.endpoint import ANY_BODY, BodyLimit, Call, Handler, json_endpoint
from rollgym.server.policy import DEFAULT_PAUSE_S, MAX_PAUSE_S, PolicyGate, oldest_version
from rollgym.server.streaming import response_stream
from rollgym.server.versions import stamp_completion, stamp_response
from rollgym.wire import PAUSE_ENDPOINT, POLICY_ENDPOINT, RESUME_ENDPOINT

RESPONSES_ENDPOINT = "/v1/responses"
CHAT_ENDPOINT = "/v1/chat/completions"
MODELS_ENDPOINT = "/v1/models"
TOKENIZE_ENDPOINT = "/tokenize"
"""vLLM's tokenizer endpoint: at the server's root, not under ``/v1`` (a client strips ``/v1``
from its base URL to reach it)."""


class ModelServer(BaseServer):
    """Base of a model server: override ``respond``."""

    kind: ClassVar[str] = "model"
    own_upstream: ClassVar[bool] = False
    """The server generates itself (replica 0 answers every call); else a call's replica is
    what its work notes (``rollgym.server.policy.note_upstream``), None if nothing does."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.policy = PolicyGate(self.name, default_replica=0 if self.own_upstream else None)

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        """The Responses API response to the create parameters ``params`` (never asked to
        stream: the base streams the answer). Return a ``Response`` instead to answer with a
        status and body of your own."""
        raise NotImplementedError(f"{type(self).__name__} must implement respond()")

    def routes(self) -> list[BaseRoute]:
        return [self.responses_route(), *policy_routes(self.policy)]

    def responses_route(self, limit: BodyLimit = ANY_BODY) -> BaseRoute:
        """``POST /v1/responses``, through the policy gate, bodies up to ``limit``."""
        return Route(RESPONSES_ENDPOINT, json_endpoint(self._responses, limit), methods=["POST"])

    async def _responses(self, body: Any, call: Call) -> dict[str, Any] | Response:
        params = json_object(body)
        stream = bool(params.get("stream"))
        asked = {**params, "stream": False} if stream else params
        ran = await self.policy.run(oldest_version(call.headers), lambda: self.respond(asked, call))
        if isinstance(ran.value, Response):
            return ran.value
        stamp_response(ran.value, ran)
        return response_stream(ran.value) if stream else ran.value


def openai_routes(
    policy: PolicyGate, chat: Handler, models: Handler, tokenize: Handler
) -> list[BaseRoute]:
    """The endpoints a model server serves beside ``/v1/responses``: ``POST`` chat
    completions (a model call: through ``policy``, its answer stamped unless streamed),
    ``GET /v1/models`` and vLLM's ``POST /tokenize``."""
    return [
        Route(CHAT_ENDPOINT, json_endpoint(gated_chat(policy, chat)), methods=["POST"]),
        Route(MODELS_ENDPOINT, json_endpoint(models), methods=["GET"]),
        Route(TOKENIZE_ENDPOINT, json_endpoint(tokenize), methods=["POST"]),
    ]


def gated_chat(policy: PolicyGate, chat: Handler) -> Handler:
    """``chat`` (a chat completions handler) as a model call through ``policy``: a whole
    completion is stamped with its version, replica and aborted versions at its top level; a
    stream is passed on as it is (it carries none)."""

    async def gated(body: Any, call: Call) -> Any:
        ran = await policy.run(oldest_version(call.headers), lambda: chat(body, call))
        if isinstance(ran.value, dict):
            stamp_completion(ran.value, ran)
        return ran.value

    return gated


# -- the policy endpoints ------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PauseRequest(_Body):
    """``POST /rollgym/pause``'s body."""

    abort: StrictBool = False
    timeout_s: float = Field(default=DEFAULT_PAUSE_S, gt=0, le=MAX_PAUSE_S)

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be a number of seconds")
        return value


class ResumeRequest(_Body):
    """``POST /rollgym/resume``'s body: ``max_staleness`` left out keeps the bound as it is."""

    version: StrictInt = Field(ge=0, le=2**63 - 1)
    max_staleness: StrictInt | None = Field(default=None, ge=0, le=2**63 - 1)


def _request(model: type[_Body], body: Any, endpoint: str) -> Any:
    try:
        return model.model_validate({} if body is None else json_object(body))
    except ValidationError as exc:
        message = format_validation_error(endpoint, exc, one_line=True)
        raise InvalidRequest(message, status=422) from None


def policy_routes(policy: PolicyGate) -> list[BaseRoute]:
    """``GET /rollgym/policy``, ``POST /rollgym/pause`` and ``POST /rollgym/resume`` of
    ``policy`` (the module docstring gives the bodies)."""

    async def state(body: Any, call: Call) -> Any:
        return policy.state()

    async def pause(body: Any, call: Call) -> Any:
        asked: PauseRequest = _request(PauseRequest, body, PAUSE_ENDPOINT)
        return await policy.pause(abort=asked.abort, timeout_s=asked.timeout_s)

    async def resume(body: Any, call: Call) -> Any:
        if body is None:
            raise InvalidRequest(f"{RESUME_ENDPOINT}: a body with 'version' is needed", status=422)
        asked: ResumeRequest = _request(ResumeRequest, body, RESUME_ENDPOINT)
        return policy.resume(
            asked.version, asked.max_staleness,
            set_staleness="max_staleness" in asked.model_fields_set,
        )  # fmt: skip

    return [
        # POST too: rollgym's own client (PolicyControl) sends every call as a POST.
        Route(POLICY_ENDPOINT, json_endpoint(state), methods=["GET", "POST"]),
        Route(PAUSE_ENDPOINT, json_endpoint(controlled(pause, PAUSE_ENDPOINT)), methods=["POST"]),
        Route(
            RESUME_ENDPOINT, json_endpoint(controlled(resume, RESUME_ENDPOINT)), methods=["POST"]
        ),
    ]


def controlled(handler: Handler, endpoint: str) -> Handler:
    """``handler`` for callers that send the control token only (``rollgym.control_token``)."""

    async def guarded(body: Any, call: Call) -> Any:
        # Read per call (a few syscalls; these calls are rare): a token the owner replaced
        # takes effect without a restart.
        require(call.headers, control_token(), endpoint)
        return await handler(body, call)

    return guarded


def model_list(*ids: str, owned_by: str = "rollgym") -> dict[str, Any]:
    """``GET /v1/models``'s answer (OpenAI's shape) listing ``ids``."""
    return {
        "object": "list",
        "data": [{"id": i, "object": "model", "created": 0, "owned_by": owned_by} for i in ids],
    }


def json_object(body: Any) -> dict[str, Any]:
    """``body`` if it is a JSON object; else the caller's mistake (422)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", status=422)
    return body


__all__ = [
    "Call",
    "ModelServer",
    "controlled",
    "json_object",
    "model_list",
    "openai_routes",
    "policy_routes",
]
