"""Agent servers: ``POST /run`` turns one task row into one verified rollout, from one hook.

    class AskOnce(AgentServer):
        async def run(self, row: dict, ctx: RunContext) -> dict:
            episode = ctx.episode()                 # this rollout's session on the resources
            await episode.seed(row)
            response = await ctx.respond(row["responses_create_params"])
            return await episode.verify(row, response)

The base owns ``/run`` (and ``/aggregate_metrics``, forwarded to the ``resources`` server, as
NeMo Gym's collector asks the agent for it): reading the body, validating the task row (422), the rollout id (the
caller's ``x-rollgym-rollout``, or a fresh one), cancelling the rollout with its requests in
flight if the caller disconnects, and error bodies: a failure of the model or resources server
is answered 502/504 with that server's error as ``origin``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from pydantic import Field, ValidationError
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.config import format_validation_error
from rollgym.errors import InvalidRequest, ProtocolError
from rollgym.http import HttpClient, Target
from rollgym.protocol import HEADER_ROLLOUT, TaskRow, rollout_key
from rollgym.server.base import BaseServer, ModelPeer, ResourcesPeer, ServerContext
from rollgym.server.endpoint import Call, JSONResponse, json_endpoint
from rollgym.server.episode import Episode, ResourcesClient
from rollgym.server.model import RESPONSES_ENDPOINT


class ModelClient:
    """Calls to one model server's ``/v1/responses`` on behalf of rollouts."""

    def __init__(self, http: HttpClient, target: Target, *, timeout: float = 600.0) -> None:
        self.http, self.target, self.timeout = http, target, timeout

    async def respond(self, params: dict[str, Any], rollout: str) -> dict[str, Any]:
        """The model's Responses API response to ``params``, for rollout ``rollout``."""
        response = await self.http.call(
            self.target, RESPONSES_ENDPOINT, params, headers={HEADER_ROLLOUT: rollout},
            deadline=self.timeout, sticky=rollout,
        )  # fmt: skip
        if not (isinstance(response, dict) and isinstance(response.get("output"), list)):
            raise ProtocolError(
                "model response has no 'output' list", server=self.target.name,
                endpoint=RESPONSES_ENDPOINT, body=orjson.dumps(response),
            )  # fmt: skip
        return response


@dataclass(frozen=True)
class RunContext:
    """One rollout as its agent sees it: its id, and its model and resources servers."""

    rollout: str
    agent: AgentServer

    def episode(self, resources: str | None = None) -> Episode:
        """A session of this rollout on resources server ``resources`` (default: the
        ``resources`` option)."""
        return self.agent.resources_client(resources).episode(self.rollout)

    async def respond(self, params: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """The response of model server ``model`` (default: the ``model`` option)."""
        return await self.agent.model_client(model).respond(params, self.rollout)


class AgentServer(BaseServer):
    """Base of an agent: override ``run``."""

    kind: ClassVar[str] = "agent"

    class Options(BaseServer.Options):
        model: ModelPeer = "model"
        resources: ResourcesPeer = "resources"
        model_timeout: float = Field(default=600.0, gt=0, description="seconds per model call")
        tool_timeout: float = Field(default=120.0, gt=0, description="seconds per tool call")
        verify_timeout: float = Field(default=300.0, gt=0, description="seconds per verify")

    options: Options

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        """Run one rollout of task ``row``; return the verify response (with ``reward``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self._models: dict[str, ModelClient] = {}
        self._resources: dict[str, ResourcesClient] = {}

    async def startup(self) -> None:
        # Fail at start, not at the first rollout, when a peer is not in the run.
        self.model_client()
        self.resources_client()

    def model_client(self, name: str | None = None) -> ModelClient:
        name = name or self.options.model
        if name not in self._models:
            self._models[name] = ModelClient(
                self.client, self.peer(name), timeout=self.options.model_timeout
            )
        return self._models[name]

    def resources_client(self, name: str | None = None) -> ResourcesClient:
        name = name or self.options.resources
        if name not in self._resources:
            self._resources[name] = ResourcesClient(
                self.client, self.peer(name), tool_timeout=self.options.tool_timeout,
                verify_timeout=self.options.verify_timeout,
            )  # fmt: skip
        return self._resources[name]

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/run", json_endpoint(self._run), methods=["POST"]),
            Route("/aggregate_metrics", json_endpoint(self._aggregate), methods=["POST"]),
        ]

    async def _aggregate(self, body: Any, call: Call) -> Any:
        # NeMo Gym's collector asks each agent; the metrics are the environment's to compute
        # (its simple_agent forwards the same way), and its answer goes back as it is.
        return await self.client.call(
            self.peer(self.options.resources), "/aggregate_metrics", body,
            deadline=self.options.verify_timeout,
        )  # fmt: skip

    async def _run(self, body: Any, call: Call) -> Response:
        row = task_row(body)
        rollout = call.rollout or _rollout_id(row)
        verified = await self.run(row, RunContext(rollout, self))
        return JSONResponse(verified, headers={HEADER_ROLLOUT: rollout})


def task_row(body: Any) -> dict[str, Any]:
    """``body`` if it is a valid task row; else the caller's mistake (422)."""
    if not isinstance(body, dict):
        raise InvalidRequest("/run expects a task row (a JSON object)", status=422)
    try:
        TaskRow.model_validate(body)
    except ValidationError as exc:
        message = format_validation_error("/run: not a valid task row", exc, one_line=True)
        raise InvalidRequest(message, status=422) from None
    return body


def _rollout_id(row: dict[str, Any]) -> str:
    if row.get("task_index") is not None and row.get("rollout_index") is not None:
        return rollout_key(row)
    # An unstamped row (a trainer calling /run itself) gets an id of its own: a shared one
    # would pin every such rollout to one replica (sticky balancing) and give them all the
    # same scripted alternative.
    return os.urandom(16).hex()


__all__ = ["AgentServer", "Episode", "ModelClient", "ResourcesClient", "RunContext"]
