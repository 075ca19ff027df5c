"""The spans of a rollout's trace, and the context carried from hop to hop.

A rollout's trace, as the hooks build it::

    rollout                                   collector (a root: a rollout never joins its
    └─ agent /run                             caller's trace, it links to it)
       └─ POST /run            attempt 1      CLIENT; sends ``traceparent``
          └─ POST /run                        SERVER, in the agent (context from ``traceparent``)
             ├─ model /v1/responses           the agent's call
             │  ├─ POST /v1/responses  attempt 1, failed (error.type, will_retry)
             │  ├─ http.retry_wait
             │  └─ POST /v1/responses  attempt 2
             │     └─ POST /v1/responses      SERVER, in the model server
             │        └─ upstream /v1/... ...  the proxy's upstream call, if any
             ├─ resources /seed_session ...   and every tool call, /verify (sandbox.run,
             └─ ...                           judge.ask inside the resources server)

Context crosses processes as W3C trace context (the global propagator: ``traceparent``, and
whatever ``OTEL_PROPAGATORS`` adds), injected into each attempt's headers and extracted by the
server app; inside a process it follows the task, as OpenTelemetry's context is a contextvar.

Failures set the span's status to error with the rollgym error type (``error.type``), the
server it is blamed on, its status and whether it is retryable; the status description is the
error's message, which ``RollgymError`` has already redacted and bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from rollgym.errors import RollgymError, redact_url
from rollgym.tracing import names as n
from rollgym.version import __version__
from rollgym.wire import HEADER_ROLLOUT, SCOPE_ROLLOUT
from rollgym.wire import POLICY_VERSION as POLICY_FIELD

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["Attempt", "Serving", "Tracer"]

T = TypeVar("T")


# What the hooks read of the things they trace: a leaf names no type of the layers it watches.
class Item(Protocol):
    """A rollout to run (``rollgym.collect.records.RolloutItem``)."""

    @property
    def task_index(self) -> int: ...
    @property
    def rollout_index(self) -> int: ...
    @property
    def key(self) -> str: ...
    @property
    def agent(self) -> str: ...


class Record(Protocol):
    """A rollout's record (``rollgym.collect.records.RolloutRecord``); a failed one has an
    ``error``, a scored one a ``reward``."""

    @property
    def attempts(self) -> int: ...


class Served(Protocol):
    """The server a request came to (``rollgym.server.base.BaseServer``)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...


R = TypeVar("R", bound=Record)
MESSAGE_CHARS = 300
"""The most characters of an error's message a span's status carries."""


class Tracer:
    """rollgym's spans, made with ``provider``'s tracer (``None``: the global provider)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self._tracer = trace.get_tracer(n.INSTRUMENTATION, __version__, provider)

    def flush(self, timeout: float) -> None:
        """Export what the provider's processors hold, waiting at most ``timeout`` seconds."""
        provider = self.provider or trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is not None:
            force_flush(int(timeout * 1000))

    # -- the collector -------------------------------------------------------------------------

    async def rollout(self, work: Coroutine[Any, Any, R], item: Item) -> R:
        """``work`` (running ``item`` to its record) inside the rollout's root span."""
        caller = trace.get_current_span().get_span_context()
        span = self._tracer.start_span(
            n.ROLLOUT_SPAN,
            context=context.Context(),  # a new trace: one per rollout, whoever runs it
            kind=SpanKind.INTERNAL,
            attributes={
                n.TASK_INDEX: item.task_index,
                n.ROLLOUT_INDEX: item.rollout_index,
                n.ROLLOUT: item.key,
                n.AGENT: item.agent,
            },
            links=[Link(caller)] if caller.is_valid else None,
        )
        token = context.attach(trace.set_span_in_context(span))
        try:
            record = await work
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, f"cancelled: {type(exc).__name__}"))
            raise
        else:
            span.set_attribute(n.ATTEMPTS, record.attempts)
            error = getattr(record, "error", None)
            if isinstance(error, RollgymError):
                span.set_attribute(n.OUTCOME, "failed")
                failed(span, error)
            else:
                span.set_attribute(n.OUTCOME, "scored")
                span.set_attribute(n.REWARD, float(getattr(record, "reward", 0.0)))
            return record
        finally:
            context.detach(token)
            span.end()

    # -- the HTTP client -----------------------------------------------------------------------

    def call(
        self, work: Coroutine[Any, Any, T], server: str, endpoint: str
    ) -> Coroutine[Any, Any, T]:
        """``work`` (one call's retry loop) inside the call's span, its attempts children of
        it. Untraced outside any trace (start-up health waits, ``/stats`` reads: a trace is a
        rollout's, or a request's that a server received), and in a trace the sampler left out
        (``OTEL_TRACES_SAMPLER``), whose spans would record nothing anyway."""
        if not trace.get_current_span().is_recording():
            return work
        return self._call(work, server, endpoint)

    async def _call(self, work: Awaitable[T], server: str, endpoint: str) -> T:
        with self._tracer.start_as_current_span(
            n.call_span(server, endpoint),
            kind=SpanKind.INTERNAL,
            attributes={n.SERVER: server, n.ENDPOINT: endpoint},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                value = await work
            except RollgymError as err:
                span.set_attribute(n.ATTEMPTS, err.attempts)
                failed(span, err)
                raise
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, f"cancelled: {type(exc).__name__}"))
                raise
            answer = value[0] if isinstance(value, tuple) else value  # with cookies
            if isinstance(answer, dict):
                version = answer.get(POLICY_FIELD)
                if isinstance(version, int) and not isinstance(version, bool):
                    span.set_attribute(n.POLICY_VERSION, version)
            return value

    def attempt(self, server: str, endpoint: str, url: str, attempt: int) -> Attempt | None:
        """Start the client span of attempt number ``attempt`` of the current call (``None``
        outside any trace, as ``call``)."""
        call = trace.get_current_span()
        if not call.is_recording():
            # Sampled out: no span, but the trace context still goes on (flagged not sampled),
            # so the servers downstream leave the rollout out too and make no trace of their own.
            return (
                Attempt(self._tracer, call, attempt) if call.get_span_context().is_valid else None
            )
        call.set_attribute(n.ATTEMPTS, attempt)  # the last one started: the call's count
        span = self._tracer.start_span(
            n.attempt_span(endpoint),
            kind=SpanKind.CLIENT,
            attributes={
                n.HTTP_METHOD: "POST",
                n.URL_FULL: redact_url(url) or "",
                n.SERVER: server,
                n.ENDPOINT: endpoint,
                n.ATTEMPT: attempt,
            },
        )
        return Attempt(self._tracer, span, attempt)

    # -- the server app ------------------------------------------------------------------------

    def serving(self, server: Served, request: Request) -> Serving | None:
        """Start the server span of ``request``, continuing the caller's trace (its
        ``traceparent``), and make it current for the endpoint's own calls; ``None`` for the
        probes (``/health``, ``/stats``...: ``names.UNTRACED_PATHS``)."""
        path: str = request.scope["path"]
        if path in n.UNTRACED_PATHS:
            return None
        parent = propagate.extract(request.headers)
        sent = trace.get_current_span(parent).get_span_context()
        if sent.is_valid and not sent.trace_flags.sampled:
            # The caller's sampler left this rollout out: carry its context on, make no span
            # (rollgym's samplers are parent-based: a child of an unsampled span is unsampled).
            return Serving(trace.get_current_span(parent), context.attach(parent))
        attributes: dict[str, Any] = {
            n.HTTP_METHOD: "POST",
            n.URL_PATH: path,
            n.HTTP_ROUTE: path,
            n.SERVER: server.name,
            n.SERVER_KIND: server.kind,
        }
        rollout = request.headers.get(HEADER_ROLLOUT) or request.scope.get(SCOPE_ROLLOUT)
        if rollout:
            attributes[n.ROLLOUT] = str(rollout)[:256]
        span = self._tracer.start_span(
            f"POST {path}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return Serving(span, context.attach(trace.set_span_in_context(span, parent)))

    # -- anything else -------------------------------------------------------------------------

    def span(self, name: str, attributes: Mapping[str, Any] | None) -> AbstractContextManager[Span]:
        """A child span of the current one around a block; a ``RollgymError`` escaping it
        marks it failed with its type."""
        return _Block(self._tracer.start_as_current_span(
            name, attributes=dict(attributes or {}), record_exception=False,
            set_status_on_exception=False,
        ))  # fmt: skip


class Attempt:
    """One attempt's client span: the headers that carry it, and how it ended."""

    __slots__ = ("attempt", "span", "tracer")

    def __init__(self, tracer: trace.Tracer, span: Span, attempt: int) -> None:
        self.tracer = tracer
        self.span = span
        self.attempt = attempt

    def headers(self, headers: Mapping[str, str] | None) -> dict[str, str]:
        """``headers`` plus this attempt's trace context (``traceparent``)."""
        out = dict(headers or {})
        propagate.inject(out, context=trace.set_span_in_context(self.span))
        return out

    def answered(self, status: int) -> None:
        self.span.set_attribute(n.HTTP_STATUS, status)
        self.span.end()

    def failed(self, err: RollgymError, will_retry: bool) -> None:
        if err.status is not None:
            self.span.set_attribute(n.HTTP_STATUS, err.status)
        self.span.set_attribute(n.WILL_RETRY, will_retry)
        failed(self.span, err)
        self.span.end()

    def cancelled(self) -> None:
        self.span.set_status(Status(StatusCode.ERROR, "cancelled"))
        self.span.end()

    async def wait(self, seconds: float) -> None:
        """The retry wait after this (failed) attempt, as a span beside it in the call's."""
        with self.tracer.start_as_current_span(
            n.RETRY_WAIT_SPAN, attributes={n.DELAY: seconds, n.ATTEMPT: self.attempt}
        ):
            await asyncio.sleep(seconds)


class Serving:
    """A request's server span, current until the answer is made."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span, token: object) -> None:
        self.span = span
        self.token = token

    def answered(self, response: Response) -> None:
        status = response.status_code
        self.span.set_attribute(n.HTTP_STATUS, status)
        if status >= 400:
            error = _error_of(response)
            self.span.set_attribute(n.ERROR_TYPE, error.get("type") or str(status))
            for key, attr in (("server", n.ERROR_SERVER), ("retryable", n.RETRYABLE)):
                if isinstance(error.get(key), (str, bool)):
                    self.span.set_attribute(attr, error[key])
            message = error.get("message")
            self.span.set_status(
                Status(
                    StatusCode.ERROR,
                    f"{error.get('type') or status}: {message}"[:MESSAGE_CHARS]
                    if isinstance(message, str)
                    else str(error.get("type") or status),
                )
            )
        self._end()

    def cancelled(self) -> None:
        self.span.set_status(Status(StatusCode.ERROR, "cancelled"))
        self._end()

    def _end(self) -> None:
        context.detach(self.token)  # type: ignore[arg-type]
        self.span.end()


class _Block(AbstractContextManager[Span]):
    """A started-as-current span whose ``RollgymError`` marks it failed."""

    __slots__ = ("inner", "span")

    def __init__(self, inner: AbstractContextManager[Span]) -> None:
        self.inner = inner

    def __enter__(self) -> Span:
        self.span = self.inner.__enter__()
        return self.span

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool | None:
        if isinstance(exc, RollgymError):
            failed(self.span, exc)
        elif exc is not None:
            self.span.set_attribute(n.ERROR_TYPE, type(exc).__name__)
            self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        return self.inner.__exit__(kind, exc, tb)


def failed(span: Span, err: RollgymError) -> None:
    """Mark ``span`` failed with ``err``: its type, blamed server, status, retryability."""
    span.set_attribute(n.ERROR_TYPE, err.type)
    span.set_attribute(n.RETRYABLE, err.retryable)
    if err.server:
        span.set_attribute(n.ERROR_SERVER, err.server)
    if err.status is not None:
        span.set_attribute(n.ERROR_STATUS, err.status)
    span.set_status(Status(StatusCode.ERROR, f"{err.type}: {err.message}"[:MESSAGE_CHARS]))


def _error_of(response: Response) -> dict[str, Any]:
    """The ``error`` object of a rollgym error body (``{}`` if the body is no such thing)."""
    try:
        body = orjson.loads(response.body)
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}
