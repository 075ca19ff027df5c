"""A model server in front of an OpenAI-compatible upstream (vLLM, SGLang, OpenAI).

``POST /v1/responses`` translates Responses API requests to Chat Completions and back
(``rollgym.models.translate``); ``POST /v1/chat/completions`` passes through, and so does vLLM's
``POST /tokenize`` (to the upstream's root: ``base_url`` without its ``/v1``, where vLLM serves it
and its clients look for it). ``GET /v1/models`` lists the ``model`` option (without it the proxy
cannot say which model the upstream serves, and answers 501). Options::

    servers:
      model:
        kind: model
        impl: openai_proxy
        options:
          base_url: http://gpu-node:8000/v1   # or a list of replicas (see below)
          api_key_env: VLLM_API_KEY     # the NAME of the variable holding the key (optional)
          model: Qwen/Qwen3-8B          # sent upstream instead of the request's model (optional)
          timeout: 600                  # seconds per attempt (optional)
          idle_timeout: 60              # upstream_stream: seconds the stream may be silent
          heartbeat: 5                  # seconds between liveness probes of a busy replica
          health_path: /ping            # the probe's path at each replica's root
          probe_timeout: 5              # seconds the probe may take
          metrics_path: /metrics        # the replica's token counters (progress)
          stall_timeout: 45             # seconds without progress before a replica is stalled
          hedge: true                   # send a lost call again (see below)
          upstream_stream: false        # stream from the upstream (see the caveat below)
          upstream_retry: {max_attempts: 3}   # RetryPolicy fields (optional)
          extra_body: {top_k: 20}       # merged into every upstream request (optional)
          return_token_ids: true        # training token fields on every call (see below)
          sticky_replicas: true         # keep a rollout's calls on one replica (the default)

**The upstream's whole answer, and a hung upstream still caught.** The proxy asks its upstream
for whole answers (no ``"stream"``): what it hands on is what the upstream answers whole, tool
calls and text included. Streaming from vLLM would give the same token ids but not always the
same message: vLLM's streaming tool parsers are not its whole-answer parsers (with ``hermes``,
streamed function-call arguments may not even be JSON, and vLLM renders such arguments as
``{}`` on the next turn). A whole answer sends nothing until it is done, so each replica is
watched instead, one heartbeat for all of its calls (``rollgym.models.liveness``): while calls
are in flight there, every ``heartbeat`` seconds (5) the replica is probed, a ``POST`` to
``health_path`` at its root (``/ping``: vLLM serves it for POST too, with the check of its
GET-only ``/health``, so a dead engine answers 503; any answer below 500 means alive, e.g. the
404 of an upstream without the path) with a timeout of its own (``probe_timeout``, 5 s), and its
token counters are read (``GET metrics_path``: vLLM's ``vllm:generation_tokens_total``,
SGLang's ``sglang:generation_tokens_total``, with prompt tokens; ``rollgym.models.progress``).

- A replica that does not answer its probe (a frozen server), refuses it or answers 5xx, and
  shows no progress either (its ``/metrics`` unread in the same beat, or its token counters not
  moved since the previous beat), fails every call in flight there at once as
  ``replica_down``, and its circuit breakers open: its calls go to another replica, or fail at
  once with one replica, and new calls are refused
  (``circuit_open``, naming the cause) until the breaker's probe finds it back. A frozen
  replica is caught within ``heartbeat + probe_timeout`` (10 s) of the freeze, whatever the
  number of calls, and the run's failure budget stops a run whose only replica stays down. A
  failed probe while the counters move (a ``/ping`` slowed by a busy server) is logged and
  counted, not fatal; with no earlier reading to compare, the next failed probe decides.
- A replica that answers its probe while its counters stand still for ``stall_timeout`` seconds
  (45) with requests in its engine, or since a call sent there that its engine never started
  (vLLM's engine reports its gauges itself: stopped idle, it says idle), fails them the same
  way, as ``replica_stalled``: caught within a minute. With vLLM's data-parallel engines
  (samples labelled ``engine="N"``) each engine is judged alone: one holding requests with its
  counters still is a stall, however busy the others are. An upstream without such counters
  (``/metrics`` answers 404, e.g. OpenAI; ``metrics_path: null``; ``stall_timeout: null``) is
  not watched for progress. A limit: vLLM counts prompt tokens only when a prefill ends, so a
  single prefill longer than ``stall_timeout`` with nothing else in the engine reads as a stall
  (raise ``stall_timeout`` above the longest prefill expected).
- The watch does not cut a generation while every engine holding requests makes progress,
  but the usual bounds still do: this server's ``timeout`` (per attempt, 600 s) and
  ``upstream_retry.deadline`` (across attempts, 900 s), the agent's ``model_timeout`` (600 s
  per model call) and the collector's ``collect.rollout_timeout`` (600 s per rollout). A
  generation longer than these needs all of them raised.
- ``hedge``: a call that has run far longer than its replica's recent answers of its size (4
  times their 95th percentile, at least 10 s) is sent again to the same replica; the first
  answer wins and the other request is closed (vLLM aborts it). At most 5% of recent calls are
  hedged, or one hedge in flight per replica at a lower call rate (``rollgym.models.hedge``);
  a hedged call's ``rollgym_upstream`` entry (a chat completion: its top level) says
  ``rollgym_hedged`` with the count. So a call that a live upstream lost costs about ten
  seconds, not the attempt timeout.

``idle_timeout: null`` turns the whole watch off (only the attempt timeout bounds a call).

Upstream attempts retried after they reached the upstream may have been billed: an answer's
``rollgym_upstream`` entry lists them (``wire.FAILED_CALLS``), and a call that fails for good
says them in its error's body (``_billed``), for the agent's cost (``rollgym.server.usage``).

``upstream_stream: true`` streams from the upstream instead (``"stream": true``, usage
included): the chunks are put back together (``rollgym.models.assemble``), a client's stream on
``/v1/chat/completions`` is passed on chunk by chunk, and an upstream that sends no byte for
``idle_timeout`` seconds (time to its first byte included) fails the attempt, which also
catches a replica whose server answers while its engine is stuck. The caveat: the answer is
then what the upstream streams, which for vLLM with a tool parser is not always its whole
answer.

**Training token data** (``return_token_ids: true``): the last output item of every
``/v1/responses`` answer carries that call's ``prompt_token_ids``, ``generation_token_ids`` and
``generation_log_probs``, where NeMo Gym's ``vllm_model`` puts them for NeMo RL
(``rollgym.models.tokens``). The proxy asks vLLM for logprobs with token ids and, for a vLLM that
sends no ``prompt_token_ids``, renders the prompt with the upstream's ``/tokenize``; an answer
without usable token data fails the call (``ProtocolError``), never a record without them. The raw
fields stay under ``rollgym_upstream``. A call at
``/ng-rollout/<id>/training-token-capture/v1/responses`` asks for the same token data for that call
alone, whatever ``return_token_ids`` says (put where NeMo RL reads it, not in a capture store). Such
a call without usable token data (an upstream that gives no per-token logprobs, or no ``/tokenize``)
is answered 200, its ``rollgym_upstream`` entry saying
``rollgym_token_capture: {complete: false, reason}`` (the rollout's capture is incomplete), with one
warning per server. Chat completions pass through unchanged either way: a client asks vLLM for token
ids in its own request.

**Several replicas** (``base_url: [http://gpu-0:8000/v1, http://gpu-1:8000/v1]``, e.g. vLLM's
data-parallel servers with no load balancer): each call goes to the replica with the fewest
calls in flight, each replica has its own circuit breaker (``NAME.upstream[i]``), and a call
that a replica fails on the server's side after its retries goes to another one, each at most
once, within the call's deadline (a 4xx goes to no other). With ``sticky_replicas`` a rollout's
calls (the ``x-rollgym-rollout`` header that rollgym's agents send) stay on one replica while
its breaker is closed, so that its prefix cache is reused. A call's ``/tokenize`` goes to the
replica that generated it (``rollgym.models.replicas``).

Clients may stream too (``"stream": true`` on either endpoint): they get the answer as
server-sent events once it is complete (``rollgym.server.streaming``), the upstream's whole answer
unless ``upstream_stream`` is set.

**Policy versions, pauses, staleness** (every rollgym model server: ``rollgym.server.model``):
each answer's ``rollgym_upstream`` entry names the replica that answered (``rollgym_replica``, its
index in ``base_url``) and the policy version (the upstream's own ``rollgym_policy_version`` if
its completion has one, else this server's live version); a pause with ``abort`` closes the
upstream requests in flight, and their calls are re-issued after the resume with a fresh
deadline: the time a call is held is never counted against ``timeout`` or its retries.

Calls to the upstream go through the shared ``HttpClient``, so retries, timeouts and error
translation are those of every other rollgym call; a failure after retries propagates as the
client's typed error, which the app answers 502/504 with the upstream's error as ``origin``.
The API key goes only to the upstream, and is scrubbed from any error that passes through.
Credentials in ``base_url`` (``http://user:pass@host/v1``, in any replica's URL) are sent as
basic auth to that URL; they cannot be combined with ``api_key_env`` (refused before the run
starts).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
from pydantic import Field, SecretStr, field_validator, model_validator
from starlette.responses import Response
from starlette.routing import BaseRoute

from rollgym.config import RetryPolicy, kind_defaults
from rollgym.errors import HTTPStatusError, ProtocolError, ReplicaDown, RollgymError, redact_url
from rollgym.http.client import HttpClient, Streamed
from rollgym.http.default import default_transport
from rollgym.http.failed_attempts import collecting
from rollgym.http.sse import encode_events
from rollgym.models.assemble import assemble_chat
from rollgym.models.hedge import size_bucket
from rollgym.models.liveness import (
    HEARTBEAT_S,
    PROBE_TIMEOUT_S,
    LivenessTransport,
    Watch,
    watching,
)
from rollgym.models.progress import STALL_TIMEOUT_S
from rollgym.models.replicas import Replica, Replicas, replica_targets
from rollgym.models.tokens import (
    CAPTURE_FIELD,
    attach,
    call_tokens,
    has_logprobs,
    needs_tokenize,
    token_request,
    tokenize_request,
)
from rollgym.models.translate import (
    CHAT_ENDPOINT,
    chat_to_response,
    responses_to_chat,
)
from rollgym.server.base import ServerContext
from rollgym.server.endpoint import Call
from rollgym.server.model import (
    MODELS_ENDPOINT,
    TOKENIZE_ENDPOINT,
    ModelServer,
    json_object,
    model_list,
    openai_routes,
)
from rollgym.server.policy import note_upstream
from rollgym.server.streaming import EventStreamResponse, chat_stream
from rollgym.server.usage import error_tokens, may_have_billed
from rollgym.wire import FAILED_CALLS, POLICY_VERSION, UPSTREAM_KEY

HEDGED = "rollgym_hedged"
"""Hedged requests a call sent (``rollgym_upstream``'s, or a chat completion's top level)."""
_REDACTED = "REDACTED"
_MIN_SCRUB_LEN = 6  # a shorter "key" would blank out ordinary words in error messages

T = TypeVar("T")
log = logging.getLogger(__name__)


def _http_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError("the upstream's URL is required, e.g. http://host:8000/v1")
    return url.rstrip("/")


@dataclass(frozen=True)
class _Generated:
    """One call's answer from the replica that gave it: the completion, and the prompt's
    ``/tokenize`` answer when the completion lacked the prompt's ids."""

    replica: Replica
    completion: dict[str, Any]
    tokenized: dict[str, Any] | None


def _model_policy() -> RetryPolicy:
    return RetryPolicy.model_validate(kind_defaults("model"))


class OpenAIProxy(ModelServer):
    """Responses API and Chat Completions in front of an OpenAI-compatible upstream."""

    class Options(ModelServer.Options):
        base_url: str | list[str] = Field(description="the upstream, or a list of replicas")
        api_key_env: str | None = Field(default=None, description="the NAME of the variable")
        model: str | None = Field(default=None, description="sent instead of the request's")
        timeout: float | None = Field(default=None, gt=0, description="seconds per attempt")
        idle_timeout: float | None = Field(
            default=60.0,
            gt=0,
            description="with upstream_stream: seconds the stream may send nothing; null: no "
            "liveness watch of whole answers either",
        )
        heartbeat: float = Field(
            default=HEARTBEAT_S,
            gt=0,
            description="seconds between liveness probes of a replica with calls in flight",
        )
        health_path: str = Field(
            default="/ping",
            pattern=r"^/",
            description="the liveness probe's path at each replica's root (POSTed)",
        )
        probe_timeout: float = Field(
            default=PROBE_TIMEOUT_S, gt=0, description="seconds a liveness probe may take"
        )
        metrics_path: str | None = Field(
            default="/metrics",
            pattern=r"^/",
            description="each replica's Prometheus metrics (token counters) at its root; "
            "null: progress not watched",
        )
        stall_timeout: float | None = Field(
            default=STALL_TIMEOUT_S,
            gt=0,
            description="seconds a replica's token counters may stand still, with calls in "
            "flight, before its calls fail as stalled; null: off",
        )
        hedge: bool = Field(
            default=True,
            description="send again (to the same replica) a whole-answer call that has run far "
            "longer than its peers; the first answer wins",
        )
        upstream_stream: bool = Field(
            default=False,
            description="stream from the upstream; vLLM's streamed tool calls may differ from "
            "its whole answer",
        )
        upstream_retry: RetryPolicy = Field(default_factory=_model_policy)
        extra_body: dict[str, Any] = Field(default_factory=dict)
        return_token_ids: bool = Field(
            default=False,
            description="put each call's prompt/generation token ids and logprobs on its "
            "last output item (vLLM upstreams)",
        )
        sticky_replicas: bool = Field(
            default=True,
            description="keep a rollout's calls on one replica (its prefix cache) while healthy",
        )

        @field_validator("base_url")
        @classmethod
        def _urls(cls, value: str | list[str]) -> str | list[str]:
            if isinstance(value, str):
                return _http_url(value)
            if not value:
                raise ValueError("an empty list: give at least one upstream URL")
            urls = []
            for i, url in enumerate(value):
                try:
                    urls.append(_http_url(url))
                except ValueError as exc:
                    raise ValueError(f"item {i}: {exc}") from None
            if len(set(urls)) < len(urls):
                # Two entries for one server would double its share and split its breaker.
                twice = next(u for u in urls if urls.count(u) > 1)
                raise ValueError(f"{redact_url(twice)} is listed twice")
            return urls

        @property
        def upstream_urls(self) -> tuple[str, ...]:
            """``base_url`` as a tuple of replica URLs."""
            urls = self.base_url
            return (urls,) if isinstance(urls, str) else tuple(urls)

        @field_validator("upstream_retry", mode="before")
        @classmethod
        def _model_defaults(cls, value: Any) -> Any:
            # Fields given override a model server's retry defaults, not the generic ones.
            if value is None:  # ``upstream_retry:`` left empty in YAML
                value = {}
            return {**kind_defaults("model"), **value} if isinstance(value, dict) else value

        @field_validator("api_key_env")
        @classmethod
        def _key_is_set(cls, name: str | None) -> str | None:
            if name is not None and not os.environ.get(name):
                # Name the variable, never a value.
                raise ValueError(f"environment variable {name or '(empty name)'} is not set")
            return name

        @model_validator(mode="after")
        def _one_credential(self) -> OpenAIProxy.Options:
            # aiohttp refuses a request with both (an Authorization header and a URL's
            # user:password); caught here, it is a config error before the run, not a failure
            # of every model call.
            if self.api_key_env is not None and any(
                urlsplit(url).username is not None for url in self.upstream_urls
            ):
                raise ValueError(
                    "base_url carries credentials (user:password@) and api_key_env is set: use "
                    "one of them"
                )
            return self

    options: Options

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts = self.options
        # Its own client, whose transport watches whole-answer calls (rollgym.models.liveness);
        # the pool settings are the client's defaults. The probes have a pool of their own:
        # in this one they would wait behind the calls they watch.
        self.liveness = LivenessTransport(
            default_transport(), on_down=self._replica_down, hedging=opts.hedge
        )
        self.client = HttpClient(transport=self.liveness)
        policy = opts.upstream_retry
        if opts.timeout is not None:
            policy = policy.model_copy(update={"attempt_timeout": opts.timeout})
        self.replicas = Replicas(
            replica_targets(self.name, opts.upstream_urls, policy),
            self.client.breaker,  # each replica's targets have a breaker of their own
            sticky=opts.sticky_replicas,
            deadline=policy.deadline,
        )
        self._warned_capture = False
        idle = opts.idle_timeout
        self._watches = None
        if idle is not None and not opts.upstream_stream:
            self._watches = [self._watch(r) for r in self.replicas.all]
        # A SecretStr: the key stays out of reprs, tracebacks with locals and state dumps.
        self._api_key = (
            SecretStr(os.environ[opts.api_key_env]) if opts.api_key_env is not None else None
        )

    def _watch(self, replica: Replica) -> Watch:
        """How ``replica`` is watched (``rollgym.models.liveness``)."""
        opts, root = self.options, replica.root.urls[0]
        path, metrics = opts.health_path, opts.metrics_path
        return Watch(
            root + path, path, opts.heartbeat, opts.probe_timeout,
            None if metrics is None else root + metrics, opts.stall_timeout, replica.index,
        )  # fmt: skip

    def _replica_down(self, watch: Watch, why: str, cause: ReplicaDown) -> None:
        """The watch found replica ``watch.replica`` down or stalled (``cause``): open its
        breakers (chat and root), so that retries and new calls go elsewhere or fail at once,
        refused as ``circuit_open`` errors whose origin is ``cause``."""
        replica = self.replicas.all[watch.replica]
        for name in {replica.chat.name, replica.root.name}:
            for breaker in self.client.breakers(name):
                breaker.trip(why, cause)

    async def shutdown(self) -> None:
        await super().shutdown()
        await self.liveness.close()

    def routes(self) -> list[BaseRoute]:
        return [
            *super().routes(),
            *openai_routes(self.policy, self._chat, self._models, self._tokenize),
        ]

    async def _models(self, body: Any, call: Call) -> Any:
        if self.options.model is None:
            # Listing the upstream's models needs a GET, which rollgym's client does not
            # send; an empty or made-up list would mislead whoever picks a model from it.
            raise HTTPStatusError(
                f"{MODELS_ENDPOINT}: set servers.{self.name}.options.model to list the model "
                "this proxy serves",
                status=501, server=self.name, endpoint=MODELS_ENDPOINT, method="GET",
            )  # fmt: skip
        return model_list(self.options.model, owned_by=f"{self.name}.upstream")

    async def _tokenize(self, raw: Any, call: Call) -> Any:
        body = json_object(raw)
        if self.options.model:
            body["model"] = self.options.model  # the upstream's name for it, as in chat calls
        headers = self._auth()

        async def tokenize(replica: Replica, deadline: float | None) -> dict[str, Any]:
            return await self.client.call(
                replica.root, TOKENIZE_ENDPOINT, body, headers=headers, deadline=deadline
            )

        return await self._scrubbed(self.replicas.run(call.rollout, tokenize, root=True))

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        chat = responses_to_chat(params, model=self.options.model)
        # ``return_token_ids`` promises token data on every call: without it a call fails. A
        # capture call alone asks, and is answered 200 without them.
        required = self.options.return_token_ids
        with_tokens = required or call.token_capture
        if with_tokens:
            chat = token_request(chat)

        async def generate(replica: Replica, deadline: float | None) -> _Generated:
            completion = await self._complete(chat, replica, deadline)
            tokenized = None
            if (
                with_tokens
                and needs_tokenize(completion)
                and (required or has_logprobs(completion))
            ):
                # The prompt as the generation saw it: the same messages, tools and template
                # options (extra_body may carry chat_template_kwargs), rendered by the replica
                # that generated (replicas may differ in version or template).
                body = tokenize_request(self._with_extras(chat))
                try:
                    tokenized = await self.client.call(
                        replica.root, TOKENIZE_ENDPOINT, body, headers=self._auth(),
                        deadline=deadline,
                    )  # fmt: skip
                except RollgymError:
                    if required:
                        raise
                    # A capture call's answer stands without its prompt ids (noted below).
            return _Generated(replica, completion, tokenized)

        with collecting() as failed:
            try:
                answer = await self._scrubbed(self.replicas.run(call.rollout, generate))
            except RollgymError as err:
                raise _billed(err, failed, chat.get("model")) from None
        upstream = answer.replica.chat.name
        response = chat_to_response(
            answer.completion, params, upstream=upstream, model=chat.get("model")
        )
        if with_tokens:
            try:
                tokens = call_tokens(
                    answer.completion, upstream=upstream, tokenized=answer.tokenized
                )
            except ProtocolError as err:
                if required:
                    raise
                self._capture_missing(response, call.rollout, err)
            else:
                attach(response["output"], tokens)
        hedged = answer.completion.get(HEDGED)
        if hedged and isinstance(response.get(UPSTREAM_KEY), dict):
            response[UPSTREAM_KEY][HEDGED] = hedged
        # Attempts it retried that may have been billed: the agent counts them too.
        if (
            failed
            and isinstance(response.get(UPSTREAM_KEY), dict)
            and (billed := billed_attempts(failed))
        ):
            response[UPSTREAM_KEY][FAILED_CALLS] = billed
        return response  # streamed, if asked, by the base

    def _capture_missing(
        self, response: dict[str, Any], rollout: str | None, err: ProtocolError
    ) -> None:
        """A capture call answered without token data: the answer goes back (200), saying so in
        its ``rollgym_upstream`` entry; warned once."""
        entry = response.setdefault(UPSTREAM_KEY, {})
        if isinstance(entry, dict):
            entry[CAPTURE_FIELD] = {"complete": False, "reason": err.message}
        if not self._warned_capture:
            self._warned_capture = True
            log.warning(
                "%s: training-token-capture call of rollout %s answered without token data "
                "(%s); as in NeMo Gym 0.7 the answer stands, marked %s.complete=false (this "
                "warning is given once). Token data needs a vLLM upstream.",
                self.name, rollout, err.message, CAPTURE_FIELD,
            )  # fmt: skip

    async def _chat(self, raw: Any, call: Call) -> Any:
        body = json_object(raw)
        if self.options.model:
            body["model"] = self.options.model
        key = call.rollout
        if not body.get("stream"):
            return await self._scrubbed(
                self.replicas.run(key, lambda replica, left: self._complete(body, replica, left))
            )
        if not self.options.upstream_stream:
            whole = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            completion = await self._scrubbed(
                self.replicas.run(key, lambda replica, left: self._complete(whole, replica, left))
            )
            return chat_stream(completion, body)
        idle = self.options.idle_timeout

        async def stream(replica: Replica, deadline: float | None) -> Streamed:
            # The client's own stream request, passed on as it is; its chunks go back unchanged.
            note_upstream(replica.index)
            return await self.client.call_stream(
                replica.chat, CHAT_ENDPOINT, self._with_extras(body), idle_timeout=idle,
                headers=self._auth(), deadline=deadline,
            )  # fmt: skip

        answer = await self._scrubbed(self.replicas.run(key, stream))
        if answer.whole is not None:  # an upstream that does not stream
            return chat_stream(answer.whole, body)
        return EventStreamResponse(encode_events(answer.events))

    async def _complete(
        self, payload: dict[str, Any], replica: Replica, deadline: float | None
    ) -> dict[str, Any]:
        """``replica``'s whole chat completion for ``payload``: asked for whole and watched
        (``rollgym.models.liveness``), or with ``upstream_stream`` streamed and put back
        together."""
        payload = self._with_extras(payload)
        idle = self.options.idle_timeout
        target = replica.chat
        if not self.options.upstream_stream:
            if self._watches is None:
                whole = await self.client.call(
                    target, CHAT_ENDPOINT, payload, headers=self._auth(), deadline=deadline
                )
                note_upstream(replica.index, whole.get(POLICY_VERSION))
                return whole
            # call_stream for its idle_timeout: the client then knows that a watched attempt
            # may fail before its own timeout, and retries it rather than blame the deadline.
            # The answer is the upstream's JSON (``whole``): nothing here asks it to stream.
            watch = self._watches[replica.index]
            with watching(watch, size_bucket(payload)) as watched:
                answer = await self.client.call_stream(
                    target, CHAT_ENDPOINT, payload, idle_timeout=idle, headers=self._auth(),
                    deadline=deadline,
                )  # fmt: skip
            if watched.hedged and answer.whole is not None:
                answer.whole[HEDGED] = watched.hedged
        else:
            options = payload.get("stream_options")
            usage = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            payload = {**payload, "stream": True, "stream_options": usage}
            answer = await self.client.call_stream(
                target, CHAT_ENDPOINT, payload, idle_timeout=idle, headers=self._auth(),
                deadline=deadline,
            )  # fmt: skip
        completion = (
            answer.whole
            if answer.whole is not None
            else assemble_chat(answer.events, upstream=target.name)
        )
        # The answering replica, and the version the upstream reports (if any), for the
        # call's record (``rollgym.server.versions``).
        note_upstream(replica.index, completion.get(POLICY_VERSION))
        return completion

    def _with_extras(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {**self.options.extra_body, **payload} if self.options.extra_body else payload

    def _auth(self) -> dict[str, str] | None:
        if self._api_key is None:
            return None
        return {"Authorization": f"Bearer {self._api_key.get_secret_value()}"}

    async def _scrubbed(self, work: Awaitable[T]) -> T:
        """``work``'s result, with the API key removed from any error it raises.

        The shared redaction masks ``Bearer ...`` and ``sk-...`` strings; an upstream may also
        echo the bare key (e.g. "invalid key abc123"), which only this server knows to look for.
        """
        try:
            return await work
        except RollgymError as err:
            # ``from None``: the original, unscrubbed error must not ride along as a cause.
            raise self._scrub(err) from None

    def _scrub(self, err: RollgymError) -> RollgymError:
        key = self._api_key.get_secret_value() if self._api_key is not None else ""
        if len(key) < _MIN_SCRUB_LEN:
            return err
        changes: dict[str, Any] = {
            name: value.replace(key, _REDACTED)
            for name in ("message", "body", "url")
            if isinstance(value := getattr(err, name), str) and key in value
        }
        if err.origin is not None:
            origin = self._scrub(err.origin)
            if origin is not err.origin:
                changes["origin"] = origin
        return err.with_fields(**changes) if changes else err


def billed_attempts(failed: list[RollgymError]) -> list[list[int] | None]:
    """The upstream attempts among ``failed`` that may have been billed: each one's tokens
    from its error's ``usage``, or None (``wire.FAILED_CALLS``)."""
    return [
        None if (used := error_tokens(err)) is None else list(used)
        for err in failed
        if err.endpoint == CHAT_ENDPOINT and may_have_billed(err)
    ]


def _billed(err: RollgymError, failed: list[RollgymError], model: Any) -> RollgymError:
    """``err``, the call's final error, saying what its attempts may have billed: its body
    becomes ``{rollgym_failed_calls, model, upstream_body}`` (the upstream's own body kept
    under ``upstream_body``), where an agent counts them (``rollgym.server.usage``)."""
    billed = billed_attempts(failed)
    if not billed or err.truncated:
        return err
    said: dict[str, Any] = {FAILED_CALLS: billed, "upstream_body": err.body}
    if isinstance(model, str):
        said["model"] = model
    return err.with_fields(body=orjson.dumps(said).decode())
