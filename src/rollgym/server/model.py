"""Model servers: OpenAI-compatible ``POST /v1/responses`` from one hook.

    class Parrot(ModelServer):
        async def respond(self, params: dict, call: Call) -> dict:
            return build_response(...)   # a Responses API response object

The base reads and checks the body (a JSON object), cancels the work if the caller goes away,
and answers errors with rollgym's error body. ``call.rollout`` names the rollout, so replies
can be deterministic per rollout. Other endpoints (chat completions, ``GET /v1/models``,
vLLM's ``POST /tokenize``) are added in ``routes``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.errors import InvalidRequest
from rollgym.server.base import BaseServer
from rollgym.server.endpoint import Call, Handler, json_endpoint

RESPONSES_ENDPOINT = "/v1/responses"
CHAT_ENDPOINT = "/v1/chat/completions"
MODELS_ENDPOINT = "/v1/models"
TOKENIZE_ENDPOINT = "/tokenize"
"""vLLM's tokenizer endpoint: at the server's root, not under ``/v1`` (NeMo Gym's vLLM client
strips ``/v1`` from its base URL to reach it)."""


class ModelServer(BaseServer):
    """Base of a model server: override ``respond``."""

    kind: ClassVar[str] = "model"

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        """The Responses API response to the create parameters ``params``. Return a
        ``Response`` instead to answer with a status and body of your own."""
        raise NotImplementedError(f"{type(self).__name__} must implement respond()")

    def routes(self) -> list[BaseRoute]:
        return [Route(RESPONSES_ENDPOINT, json_endpoint(self._responses), methods=["POST"])]

    async def _responses(self, params: Any, call: Call) -> dict[str, Any] | Response:
        return await self.respond(json_object(params), call)


def openai_routes(chat: Handler, models: Handler, tokenize: Handler) -> list[BaseRoute]:
    """The endpoints a model server serves beside ``/v1/responses``: ``POST`` chat
    completions, ``GET /v1/models`` and vLLM's ``POST /tokenize``."""
    return [
        Route(CHAT_ENDPOINT, json_endpoint(chat), methods=["POST"]),
        Route(MODELS_ENDPOINT, json_endpoint(models), methods=["GET"]),
        Route(TOKENIZE_ENDPOINT, json_endpoint(tokenize), methods=["POST"]),
    ]


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


__all__ = ["Call", "ModelServer", "json_object", "model_list"]
