"""Agent servers: ``POST /run`` turns one task row into one verified rollout, from one hook.

    class AskOnce(AgentServer):
        async def run(self, row: dict, ctx: RunContext) -> dict:
            episode = ctx.episode()                 # this rollout's session on the resources
            await episode.seed(row)
            response = await ctx.respond(row["responses_create_params"])
            return await episode.verify(row, response)

The base owns ``/run`` (and ``/aggregate_metrics`` and ``/fingerprint``, forwarded to the
``resources`` server: the collector asks the agent for the first, the trainer's stream for the
second): reading the body, validating the task row (422), the
rollout id (the caller's ``x-rollgym-rollout``, or a fresh one), cancelling the rollout with its
requests in flight if the caller disconnects, and error bodies: a failure of the model or
resources server is answered 502/504 with that server's error as ``origin``.

Other protocols are dialects (``AgentDialect``), listed by the process's entry point
(``rollgym.dialects``) and handed over in ``ServerContext.dialects``: each adds endpoints and
may take ``/run`` bodies of its own shape, running them through ``AgentServer.attempt``. An
agent that implements ``turn`` (one turn of its loop, no seed, no verify) can be driven turn by
turn by a dialect's endpoints.

Each model call sends the oldest policy version of the rollout's earlier calls
(``x-rollgym-oldest-version``, learnt from each answer: ``rollgym.server.versions``), so a model
server with a staleness bound can refuse the next call of a stale rollout (409,
``stale_rollout``): that error ends the rollout, as the root of its failure. A model call may
be held by a pause of its model server for ``model_pause_s`` seconds beyond ``model_timeout``.

Every verified rollout also carries ``rollgym_timing`` (``Hops.to_dict``): the seconds of each
hop the rollout made through its context (seed, model calls, tool calls, verify), the retries
inside them and the time they spent waiting between attempts, for ``rollgym report``; and
``rollgym_cost`` (``Hops.cost``), what it cost, each model call's tokens included.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Awaitable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import orjson
from pydantic import Field, ValidationError
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.config import format_validation_error
from rollgym.errors import (
    ConfigError,
    HTTPStatusError,
    InternalError,
    InvalidRequest,
    ProtocolError,
    RollgymError,
)
from rollgym.http import HttpClient, Target
from rollgym.http.failed_attempts import collecting
from rollgym.prometheus.latency import LatencyByName
from rollgym.prometheus.samples import HistogramSample, Sample
from rollgym.protocol import TaskRow, rollout_key
from rollgym.server.app import MAX_ROLLOUT_ID_CHARS
from rollgym.server.base import BaseServer, ModelPeer, ResourcesPeer, ServerContext
from rollgym.server.endpoint import Call, JSONResponse, error_response, json_endpoint
from rollgym.server.episode import Episode, Grant, ResourcesClient, Ungranted
from rollgym.server.fingerprint import ask_replicas
from rollgym.server.model import RESPONSES_ENDPOINT
from rollgym.server.policy import MAX_PAUSE_S
from rollgym.server.usage import (
    answered_call,
    billed_failures,
    rollout_cost,
    verify_spend,
    with_verify_spend,
    without_spend,
)
from rollgym.server.versions import CallVersions
from rollgym.wire import (
    COST_FIELD,
    FINGERPRINT_ENDPOINT,
    HEADER_OLDEST_VERSION,
    HEADER_ROLLOUT,
    ROLLOUT_PREFIX,
    TOKEN_CAPTURE_SEGMENT,
)

log = logging.getLogger("rollgym.server")

MODEL_PAUSE_S = 600.0
"""The default seconds a model call may be held by a pause beyond ``model_timeout``: the
default pause of ``rollgym.trainer.policy_control`` (a server's own default, 300 s, fits too)."""

TIMING_FIELD = "rollgym_timing"
"""The verify response's field that holds the rollout's ``Hops``."""


class _Call:
    """One timed hop's attempts, counted by ``count_attempt`` (the client retries inside)."""

    __slots__ = ("attempts", "sent_s")

    def __init__(self) -> None:
        self.attempts = 0
        self.sent_s = 0.0


# The hop being timed in this task: set around each call (concurrent tool calls run in tasks of
# their own, so each sees its own), read by ``count_attempt`` for every attempt the client sends.
_CALL: ContextVar[_Call | None] = ContextVar("rollgym_hop_call", default=None)


class Hops:
    """Per-hop timing of one rollout: seconds of every seed, model, tool and verify call, the
    retries inside them, and the time they waited between attempts (backoff)."""

    __slots__ = (
        "failed",
        "failed_calls",
        "model",
        "retries",
        "seconds",
        "started",
        "tokens",
        "verify_spent",
        "wait_s",
    )

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}
        self.tokens: list[list[int] | None] = []
        """Each model call's ``[input, output]`` tokens (None: its answer said neither), in
        call order: the rollout's cost (``rollgym.collect.cost``)."""
        self.failed_calls = 0
        """Model calls among ``tokens`` that failed (``RunContext.respond``)."""
        self.model: str | None = None
        """The model its model calls' answers named last (a failure's cost is priced by it)."""
        self.retries: dict[str, int] = {}
        self.verify_spent: dict[str, Any] = {}
        """What its failed verify attempts said they spent (their judge calls)."""
        self.wait_s = 0.0
        self.started = time.monotonic()
        self.failed: str | None = None
        """The hop whose call failed last (``None``: none has): where a failed rollout failed."""

    async def timed(self, hop: str, call: Awaitable[Any]) -> Any:
        """Await ``call`` as one ``hop``, and record it (failed calls too)."""
        counted = _Call()
        token = _CALL.set(counted)
        t0 = time.monotonic()
        try:
            return await call
        except Exception:
            self.failed = hop
            raise
        finally:
            took = time.monotonic() - t0
            _CALL.reset(token)
            self.seconds.setdefault(hop, []).append(took)
            if counted.attempts > 1:
                self.retries[hop] = self.retries.get(hop, 0) + counted.attempts - 1
                self.wait_s += max(0.0, took - counted.sent_s)

    def cost(self, verified: dict[str, Any]) -> dict[str, Any]:
        """The rollout's ``rollgym_cost``, from these hops and its verify response
        (``rollgym.server.usage.rollout_cost``)."""
        return rollout_cost(
            with_verify_spend(verified, self.verify_spent), self.seconds, self.tokens,
            self.retries, self.failed_calls,
        )  # fmt: skip

    def spent(self) -> dict[str, Any]:
        """What a rollout that failed had spent (its model calls' tokens, its hops' seconds,
        its retries, what its failed verify said it spent): its ``rollgym_cost`` without
        ``per_call``, so the error answer that carries it stays small."""
        answered: dict[str, Any] = {**self.verify_spent}
        if self.model is not None:
            answered["response"] = {"model": self.model}
        cost = rollout_cost(answered, self.seconds, self.tokens, self.retries, self.failed_calls)
        del cost["per_call"]
        return cost

    def to_dict(self) -> dict[str, Any]:
        """The record: ``{hop: [seconds...], "retries": {hop: n}, "wait_s", "total_s", "end"}``
        (``end``: wall-clock time, so a report can plot the run over time)."""
        out: dict[str, Any] = {k: [round(s, 5) for s in v] for k, v in self.seconds.items()}
        out["retries"] = self.retries
        out["wait_s"] = round(self.wait_s, 5)
        out["total_s"] = round(time.monotonic() - self.started, 5)
        out["end"] = round(time.time(), 3)
        return out


def count_attempt(seconds: float) -> None:
    """The agent's client's ``on_attempt``: count one attempt, and the ``seconds`` it took,
    against the hop being timed in this task (if any), so ``Hops`` knows a call's retries and
    its wait between attempts."""
    call = _CALL.get()
    if call is not None:
        call.attempts += 1
        call.sent_s += seconds


Phase = Literal["seed", "agent", "verify"]
"""Where in its rollout a failed call was: the seed, the agent's own turn (a model or tool call,
a Gymnasium ``step``, an agent's own hop) or the verify."""


def failed_phase(hops: Hops) -> Phase | None:
    """The phase where a rollout timed by ``hops`` failed; ``None`` when none of its hops
    failed (the agent's own code did)."""
    if hops.failed is None:
        return None
    return _PHASES.get(hops.failed, "agent")


_PHASES: dict[str, Phase] = {"seed": "seed", "verify": "verify"}


class TimedEpisode(Episode):
    """An ``Episode`` whose seed, tool and verify calls are recorded in ``hops``."""

    def __init__(
        self,
        resources: ResourcesClient,
        rollout: str,
        hops: Hops,
        *,
        cookies: dict[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(resources, rollout, cookies=cookies, headers=headers)
        self.hops = hops

    async def seed(self, row: dict[str, Any]) -> None:
        await self.hops.timed("seed", super().seed(row))

    async def send_tool(self, name: str, arguments: Any) -> str:
        output: str = await self.hops.timed("tool", super().send_tool(name, arguments))
        return output

    async def verify(self, row: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
        # A verify attempt that failed may say what it spent (its judge's calls) beside its
        # error: counted in the rollout's cost, whether the verify then failed or a retry
        # answered (``rollgym.server.usage.verify_spend``).
        with collecting() as failed:
            try:
                verified: dict[str, Any] = await self.hops.timed(
                    "verify", super().verify(row, response)
                )
            except RollgymError as err:
                raise without_spend(err) from None  # said once: on the rollout's cost
            finally:
                for attempt in failed:
                    verify_spend(attempt, self.hops.verify_spent)
        return verified


class ModelClient:
    """Calls to one model server's ``/v1/responses`` on behalf of rollouts.

    ``pause_s``: the seconds a call may be held by a pause of its model server (a weight
    update, ``/rollgym/pause``) on top of ``timeout``: the call's deadline and the per-attempt
    timeout of ``target``'s policy are both raised by it, so a call held by a pause of
    legitimate length is not timed out and sent again."""

    def __init__(
        self, http: HttpClient, target: Target, *, timeout: float = 600.0, pause_s: float = 0.0
    ) -> None:
        self.http, self.target, self.timeout = http, with_pause(target, pause_s), timeout + pause_s

    async def respond(
        self,
        params: dict[str, Any],
        rollout: str,
        *,
        token_capture: bool = False,
        oldest_version: int | None = None,
    ) -> dict[str, Any]:
        """The model's Responses API response to ``params``, for rollout ``rollout``;
        ``token_capture``: asked for with training token ids, at
        ``/ng-rollout/<id>/training-token-capture/v1/responses`` (``capture_endpoint``);
        ``oldest_version``: the oldest policy version of the
        rollout's earlier model calls, sent as ``x-rollgym-oldest-version`` (the model server
        refuses the call, ``stale_rollout``, if that is too far behind its live version)."""
        if params.get("stream"):
            # A row asking for a stream would get server-sent events back: the agent needs the
            # whole response (the model server still streams from its upstream itself).
            params = {**params, "stream": False}
        endpoint = capture_endpoint(rollout) if token_capture else RESPONSES_ENDPOINT
        headers = {HEADER_ROLLOUT: rollout}
        if oldest_version is not None:
            headers[HEADER_OLDEST_VERSION] = str(oldest_version)
        response = await self.http.call(
            self.target, endpoint, params, headers=headers, deadline=self.timeout,
            sticky=rollout,
        )  # fmt: skip
        if not (isinstance(response, dict) and isinstance(response.get("output"), list)):
            raise ProtocolError(
                "model response has no 'output' list", server=self.target.name,
                endpoint=endpoint, body=orjson.dumps(response),
            )  # fmt: skip
        return response


def with_pause(target: Target, pause_s: float) -> Target:
    """``target`` with ``pause_s`` more seconds per attempt (its endpoints' own attempt
    timeouts too) and in total: room for a model call held by a pause."""
    if pause_s <= 0:
        return target
    policy = target.policy
    endpoints = {
        path: override
        if override.attempt_timeout is None
        else override.model_copy(update={"attempt_timeout": override.attempt_timeout + pause_s})
        for path, override in policy.endpoints.items()
    }
    longer = policy.model_copy(
        update={
            "attempt_timeout": policy.attempt_timeout + pause_s,
            "deadline": policy.deadline + pause_s,
            "endpoints": endpoints,
        }
    )
    return Target(target.name, target.urls, longer)


def capture_endpoint(rollout: str) -> str:
    """The model's token-capture path for rollout ``rollout``: its id as a path id the model
    server's app takes (other characters as ``-``: the header still carries the id itself)."""
    path_id = _NOT_ID.sub("-", rollout)[:MAX_ROLLOUT_ID_CHARS]
    if not path_id[:1].isalnum():
        path_id = "r" + path_id[: MAX_ROLLOUT_ID_CHARS - 1]
    return f"/{ROLLOUT_PREFIX}/{path_id}/{TOKEN_CAPTURE_SEGMENT}{RESPONSES_ENDPOINT}"


_NOT_ID = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class RunContext:
    """One rollout as its agent sees it: its id, and its model and resources servers."""

    rollout: str
    agent: AgentServer
    hops: Hops = field(default_factory=Hops)
    """The timing of the calls made through this context (recorded as ``rollgym_timing``)."""
    grant: Grant | None = None
    """In a turn its caller granted resources for: the resources session its caller seeded."""
    token_capture: bool = False
    """The caller asked for training token ids (the ``training-token-capture`` path): the
    model calls ask for them too."""
    versions: CallVersions = field(default_factory=CallVersions)
    """The policy versions of this rollout's model calls so far (the oldest is sent on each
    next call, so a model server can refuse a stale rollout)."""

    def episode(self, resources: str | None = None) -> Episode:
        """A session of this rollout on resources server ``resources`` (default: the
        ``resources`` option). In a granted turn: the granted session (``resources`` must not
        be named: the turn reaches only what its caller granted)."""
        if self.grant is None:
            return TimedEpisode(self.agent.resources_client(resources), self.rollout, self.hops)
        if resources is not None:
            raise ConfigError(
                f"an agent session reaches only the resources it was granted, not {resources!r}"
            )
        if self.grant.resources is None:
            return Ungranted(self.rollout)  # nothing granted: every call is refused
        return TimedEpisode(
            self.grant.resources, self.rollout, self.hops, cookies=self.grant.cookies,
            headers=self.grant.headers,
        )  # fmt: skip

    async def respond(self, params: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """The response of model server ``model`` (default: the ``model`` option)."""
        client = self.agent.model_client(model)
        call = client.respond(
            params, self.rollout, token_capture=self.token_capture,
            oldest_version=self.versions.oldest,
        )  # fmt: skip
        # Every attempt that failed after it reached the model may have been billed (one
        # the client retried too): counted with its error's usage where it says one, else
        # as a call whose tokens are not known; never as free (``rollgym.server.usage``).
        with collecting() as failed:
            try:
                response: dict[str, Any] = await self.hops.timed("model", call)
            finally:
                n, model = billed_failures(failed, self.hops.tokens)
                self.hops.failed_calls += n
                if self.hops.model is None:
                    self.hops.model = model
        self.versions.saw(response)
        self.hops.failed_calls += answered_call(response, self.hops.tokens)
        if isinstance(named := response.get("model"), str):
            self.hops.model = named
        return response


@dataclass(frozen=True)
class Attempt:
    """One rollout run to its end for a dialect: its verify response (with ``rollgym_timing``),
    or the error it failed with and the phase where it did."""

    rollout: str
    verified: dict[str, Any] | None
    error: RollgymError | None = None
    failed_in: Phase | None = None
    spent: dict[str, Any] | None = None
    """A failed rollout's spend before it failed (``Hops.spent``): its dialect's failure
    answer carries it, as the flat ``/run`` answers a failure with it."""


@runtime_checkable
class AgentDialect(Protocol):
    """A protocol an agent server speaks beside its own (``/run``: a task row in, a verify
    response out): the endpoints it adds and the ``/run`` bodies it answers."""

    def routes(self, agent: AgentServer) -> list[BaseRoute]:
        """The endpoints this dialect adds to ``agent`` (asked once, when the agent is built)."""
        ...

    def takes(self, body: Any) -> bool:
        """Whether a ``/run`` body is this dialect's (the first dialect that takes it answers)."""
        ...

    async def run(self, agent: AgentServer, body: Any) -> Response:
        """The answer to a ``/run`` body it takes (``agent.attempt`` runs the rollout)."""
        ...


class AgentServer(BaseServer):
    """Base of an agent: override ``run``."""

    kind: ClassVar[str] = "agent"

    class Options(BaseServer.Options):
        model: ModelPeer = "model"
        resources: ResourcesPeer = "resources"
        model_timeout: float = Field(default=600.0, gt=0, description="seconds per model call")
        model_pause_s: float = Field(
            default=MODEL_PAUSE_S,
            ge=0,
            le=MAX_PAUSE_S,
            description="seconds a model call may be held by its model server's pause (a "
            "weight update), on top of model_timeout and the per-attempt timeout",
        )
        tool_timeout: float = Field(default=120.0, gt=0, description="seconds per tool call")
        verify_timeout: float = Field(default=300.0, gt=0, description="seconds per verify")

    options: Options

    async def run(self, row: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        """Run one rollout of task ``row``; return the verify response (with ``reward``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    async def turn(self, params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        """One turn, as a dialect's endpoints drive it: the agent's loop on create params
        ``params`` against ``ctx.episode()`` (the resources its caller granted), answering the
        turn's Responses API response; no seed, no verify (the caller does both). An agent
        without one refuses turns (501)."""
        raise NotImplementedError(f"{type(self).__name__} takes no agent-session turns")

    def takes_turns(self) -> bool:
        """Whether this agent implements ``turn`` (else turns are refused)."""
        return type(self).turn is not AgentServer.turn

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        # Its own client, which counts each hop's attempts (``Hops``); the pool settings and
        # the transport are the client's defaults.
        self.client = HttpClient(on_attempt=count_attempt)
        self._models: dict[str, ModelClient] = {}
        self._resources: dict[str, ResourcesClient] = {}
        self.dialects = [d for d in ctx.dialects if isinstance(d, AgentDialect)]
        """The dialects this agent speaks, in their entry point's order."""
        self._dialect_routes = [route for d in self.dialects for route in d.routes(self)]
        self.hop_seconds = LatencyByName()
        """The seconds of every hop of every rollout run here, by hop (``/metrics``)."""

    def exported(self) -> list[Sample]:
        """The per-hop latency for ``/metrics`` (``rollgym.prometheus.samples.Exported``)."""
        return [
            HistogramSample(
                "agent_hop_seconds", "Seconds of an agent's hops (seed, model, tool, verify, "
                "...), retries included, by hop.", "hop", self.hop_seconds,
            )
        ]  # fmt: skip

    def observe_hops(self, hops: Hops) -> None:
        """Count a finished rollout's hops (failed ones too) in ``hop_seconds``."""
        observe = self.hop_seconds.observe
        for hop, seconds in hops.seconds.items():
            for took in seconds:
                observe(hop, took)

    async def startup(self) -> None:
        # Fail at start, not at the first rollout, when a peer is not in the run.
        self.model_client()
        self.resources_client()

    def model_client(self, name: str | None = None) -> ModelClient:
        name = name or self.options.model
        if name not in self._models:
            self._models[name] = ModelClient(
                self.client, self.peer(name), timeout=self.options.model_timeout,
                pause_s=self.options.model_pause_s,
            )  # fmt: skip
        return self._models[name]

    def resources_client(self, name: str | None = None) -> ResourcesClient:
        name = name or self.options.resources
        if name not in self._resources:
            self._resources[name] = ResourcesClient(
                self.client, self.peer(name), tool_timeout=self.options.tool_timeout,
                verify_timeout=self.options.verify_timeout,
            )  # fmt: skip
        return self._resources[name]

    def granted_client(self, target: Target) -> ResourcesClient:
        """A client for a resources server a turn was granted (``target``), with this agent's
        client and timeouts."""
        return ResourcesClient(
            self.client, target, tool_timeout=self.options.tool_timeout,
            verify_timeout=self.options.verify_timeout,
        )  # fmt: skip

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/run", json_endpoint(self._run), methods=["POST"]),
            Route("/aggregate_metrics", json_endpoint(self._aggregate), methods=["POST"]),
            Route(FINGERPRINT_ENDPOINT, json_endpoint(self._fingerprint), methods=["GET", "POST"]),
            *self._dialect_routes,
        ]

    async def take_turn(
        self,
        params: dict[str, Any],
        rollout: str | None,
        grant: Grant | None,
        *,
        token_capture: bool = False,
        versions: CallVersions | None = None,
    ) -> dict[str, Any]:
        """One ``turn`` of rollout ``rollout`` (``None``: a fresh id) granted ``grant``
        (``None``: nothing granted, on the ``resources`` server); ``token_capture``: its model
        calls ask for training token ids; ``versions``: the policy versions of the rollout's
        earlier turns (its oldest goes with this turn's first model call too)."""
        if not self.takes_turns():
            raise HTTPStatusError(
                f"{type(self).__name__} takes no /v1/responses turns; use its /run", status=501
            )
        rollout = rollout or os.urandom(16).hex()
        ctx = RunContext(
            rollout, self, grant=grant, token_capture=token_capture,
            versions=versions if versions is not None else CallVersions(),
        )  # fmt: skip
        try:
            return await self.turn(params, ctx)
        finally:
            self.observe_hops(ctx.hops)

    async def _aggregate(self, body: Any, call: Call) -> Any:
        # The collector asks each agent; the metrics are the environment's to compute, and its
        # answer goes back as it is.
        return await self.client.call(
            self.peer(self.options.resources), "/aggregate_metrics", body,
            deadline=self.options.verify_timeout,
        )  # fmt: skip

    async def _fingerprint(self, body: Any, call: Call) -> Any:
        # What scores this agent's rollouts, for a caller that knows only the agent (the
        # trainer's stream): its resources server's fingerprint, asked of every replica (the
        # one that answers a call is any of them), or its word that they differ.
        target = self.peer(self.options.resources)
        said, warnings = await ask_replicas(self.client, target.name, target.urls)
        for warning in warnings:
            log.warning("%s", warning)
        return said

    async def _run(self, body: Any, call: Call) -> Response:
        for dialect in self.dialects:
            if dialect.takes(body):
                return await dialect.run(self, body)
        row = task_row(body)
        rollout = call.rollout or _rollout_id(row)
        ctx = RunContext(rollout, self)
        try:
            verified = await self.run(row, ctx)
        except RollgymError as err:
            # Answered as any error, with what the rollout spent before it failed beside it:
            # the collector carries that into the failure's record (``rollgym.collect.cost``).
            if not isinstance(err, InvalidRequest):  # as the app logs the errors it answers
                log.warning("POST /run failed: %s", err)
            return error_response(self.name, err, {COST_FIELD: ctx.hops.spent()})
        finally:
            self.observe_hops(ctx.hops)
        if isinstance(verified, dict):
            verified.setdefault(TIMING_FIELD, ctx.hops.to_dict())
            # Set, never kept from the verify response: what a row or an environment wrote
            # there is no measurement of this rollout.
            verified[COST_FIELD] = ctx.hops.cost(verified)
        return JSONResponse(verified, headers={HEADER_ROLLOUT: rollout})

    async def attempt(self, row: dict[str, Any], rollout: str) -> Attempt:
        """Run rollout ``rollout`` of task row ``row`` to its end, for a dialect that answers
        failures itself: a failure is returned, not raised (an agent's crash too, as an
        ``InternalError``)."""
        ctx = RunContext(rollout, self)
        try:
            verified = await self.run(row, ctx)
            if not isinstance(verified, dict):
                raise InternalError(
                    f"{type(self).__name__}.run returned {type(verified).__name__}, not the "
                    "verify response", server=self.name,
                )  # fmt: skip
        except RollgymError as err:
            return Attempt(rollout, None, err, failed_phase(ctx.hops), ctx.hops.spent())
        except Exception as exc:  # a bug in the agent: still this rollout's failure
            log.error("%s: rollout %s crashed", self.name, rollout, exc_info=exc)
            crash = InternalError(f"{type(exc).__name__}: {exc}", server=self.name)
            return Attempt(rollout, None, crash, failed_phase(ctx.hops), ctx.hops.spent())
        finally:
            self.observe_hops(ctx.hops)
        verified.setdefault(TIMING_FIELD, ctx.hops.to_dict())
        verified[COST_FIELD] = ctx.hops.cost(verified)
        return Attempt(rollout, verified)


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


__all__ = [
    "AgentDialect",
    "AgentServer",
    "Attempt",
    "Episode",
    "Hops",
    "ModelClient",
    "Phase",
    "ResourcesClient",
    "RunContext",
    "TimedEpisode",
]
