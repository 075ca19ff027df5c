"""Resources servers: an environment's tools and verifier behind HTTP.

Writing an environment takes one small class::

    class Weather(ResourcesServer):
        @tool
        async def get_weather(self, session: Session, city: str) -> dict:
            "Current weather for a city."
            return {"city": city, "temp_c": 21}

        async def verify(self, session: Session, task: dict, response: dict) -> float:
            return 1.0 if "21" in output_text(response) else 0.0

Typed tool arguments become the tool's JSON schema (``GET /tools``) and are validated on every
call (a bad call answers 422, which the agent hands back to the model). Each rollout gets its own
``Session`` from ``POST /seed_session``, held until its ``/verify`` (``rollgym.server.sessions``:
its id travels in the ``x-rollgym-session`` header or the ``rollgym_session`` cookie).

Other protocols are dialects (``ResourcesDialect``), listed by the process's entry point
(``rollgym.dialects``) and handed over in ``ServerContext.dialects``: each may take
``/seed_session`` bodies of its own shape (seeded by the same ``seed_session`` hook as a task
row, e.g. into a session its caller names: ``SessionStore.seed_named``) and add endpoints on the
server's sessions (e.g. a close). ``GET /reverify_mode`` answers the class's ``reverify_mode``:
``"stateless"`` when ``verify`` reads only the row and the response (a recorded rollout can be
scored again as it is), ``"unsupported"`` when it reads the session's state, ``"unknown"`` (the
default) when the environment does not say.

A verify that fails after it spent (a judge that answered and then failed, or failed after it
may have been billed) says so with ``verify_spent(fields)`` before it raises: its error answer
carries the fields beside the error (``rollgym_cost``, as an agent's failed ``/run`` does), and
the agent counts them in the failed rollout's cost (``rollgym.server.usage.verify_spend``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    ClassVar,
    Literal,
    Protocol,
    TypeVar,
    get_args,
    get_type_hints,
    runtime_checkable,
)

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from starlette.routing import BaseRoute, Route

from rollgym.config import format_validation_error
from rollgym.errors import (
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    RollgymError,
    WaitedTooLong,
)
from rollgym.protocol import is_reserved_name, is_tool_name, output_text
from rollgym.server.aggregate import AggregateMetricsRequest, aggregate, measured
from rollgym.server.base import BaseServer, ServerContext
from rollgym.server.cpu_pool import WARM_UP_TIMEOUT, CpuPool, warm
from rollgym.server.endpoint import (
    BodyLimit,
    Call,
    Handler,
    JSONResponse,
    error_response,
    json_endpoint,
)
from rollgym.server.fingerprint import Fingerprint, fingerprint_route
from rollgym.server.sessions import (
    Prepare,
    Session,
    SessionStore,
    in_session,
    new_session,
    session_id,
)
from rollgym.wire import (
    COST_FIELD,
    HEALTH_FAILED,
    HEALTH_STARTING,
    REVERIFY_MODE_ENDPOINT,
    session_cookie,
)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

log = logging.getLogger("rollgym.server")

_SPENT: ContextVar[dict[str, Any] | None] = ContextVar("rollgym_verify_spent", default=None)


def verify_spent(fields: dict[str, Any]) -> None:
    """What the verify being served spent so far (a judge's calls: ``judge_calls``,
    ``judge_input_tokens``, ...: ``rollgym.server.usage.VERIFY_SPEND``), for a verify about to
    fail: its error answer carries them beside the error (see the module docstring). Outside
    a verify: nothing."""
    sink = _SPENT.get()
    if sink is not None:
        sink.update(fields)


ReverifyMode = Literal["stateless", "unsupported", "unknown"]
"""``GET /reverify_mode``'s answer: can a recorded rollout be verified again from its row and
response alone (``stateless``), not (``unsupported``), or is it not said (``unknown``)."""


@runtime_checkable
class ResourcesDialect(Protocol):
    """A protocol a resources server speaks beside task rows on ``/seed_session`` (one object,
    listed in ``ServerContext.dialects``). A Gymnasium-style server takes its ``routes`` only."""

    def routes(self, sessions: SessionStore) -> list[BaseRoute]:
        """The endpoints this dialect adds on ``sessions`` (asked once, when the server is
        built)."""
        ...

    def takes(self, body: dict[str, Any]) -> bool:
        """Whether a ``/seed_session`` body is this dialect's (the first dialect that takes it
        answers; a body none takes is a task row)."""
        ...

    async def seed(
        self, body: dict[str, Any], size: int, sessions: SessionStore, prepare: Prepare
    ) -> tuple[Session, Any]:
        """Open (or find again) in ``sessions`` the session ``body`` asks for, seeded by
        ``prepare``; that session and the answer (the server sets the session's cookie)."""
        ...


def dialects_of(ctx: ServerContext) -> list[ResourcesDialect]:
    """The resources dialects among those the entry point listed, in its order."""
    return [d for d in ctx.dialects if isinstance(d, ResourcesDialect)]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    arguments: type[BaseModel]
    method_name: str

    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI Responses API function tool."""
        params = self.arguments.model_json_schema()
        params.pop("title", None)
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": params,
            "strict": False,
        }


def tool(fn: F) -> F:
    """Mark a ``ResourcesServer`` method as a tool callable at ``POST /<name>``."""
    fn.__rollgym_tool__ = True  # type: ignore[attr-defined]
    return fn


def _tool_spec(name: str, fn: Callable[..., Any]) -> ToolSpec:
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[2:]  # skip self, session
    fields: dict[str, Any] = {}
    for p in params:
        annotation = hints.get(p.name, Any)
        fields[p.name] = (annotation, ... if p.default is inspect.Parameter.empty else p.default)
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    doc = inspect.getdoc(fn) or name
    return ToolSpec(name=name, description=doc.strip(), arguments=model, method_name=name)


class ResourcesServer(BaseServer):
    """Base class of an environment. Override ``verify``; add ``@tool`` methods; optionally
    ``seed_session`` and ``aggregate_metrics``. Declare the task-row fields it reads in
    ``row_fields`` (e.g. ``frozenset({"expected_answer"})``): the collector warns about the
    others, which nobody reads."""

    kind: ClassVar[str] = "resources"
    verify_timeout: ClassVar[float] = 60.0
    cpu_verify_workers: ClassVar[int] = 2
    reverify_mode: ClassVar[ReverifyMode] = "unknown"
    """Whether ``verify`` reads only the row and the response (``"stateless"``), or the
    session's state too (``"unsupported"``): a caller asks before it scores recorded rollouts
    again."""
    version: ClassVar[str | None] = None
    """The environment's declared version, part of its fingerprint (``GET /fingerprint``)."""
    tools: ClassVar[dict[str, ToolSpec]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.tools = {
            name: _tool_spec(name, fn)
            for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if getattr(fn, "__rollgym_tool__", False)
        }
        for name in cls.tools:
            # The rule agents call tools by (``is_tool_name``): a tool it refuses would be
            # served and never called.
            if is_reserved_name(name):
                raise TypeError(
                    f"{cls.__name__}: tool name {name!r} clashes with a reserved name (an "
                    "endpoint or a server hook)"
                )
            if not is_tool_name(name):
                raise TypeError(
                    f"{cls.__name__}: tool name {name!r} is no name an agent calls (ASCII "
                    "letters, digits and _, a letter first, at most 64)"
                )
        if cls.reverify_mode not in get_args(ReverifyMode):
            raise TypeError(
                f"{cls.__name__}: reverify_mode {cls.reverify_mode!r} is not one of "
                f"{', '.join(get_args(ReverifyMode))}"
            )

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self._sessions = SessionStore(self.name, ctx.config.limits)
        self.dialects = dialects_of(ctx)
        """The dialects this server speaks, in their entry point's order."""
        self._dialect_routes = [route for d in self.dialects for route in d.routes(self._sessions)]
        self._pool: CpuPool | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._pool_lock = asyncio.Lock()
        self._warming: asyncio.Task[None] | None = None
        self._warming_what = ""
        self._warm_error: str | None = None
        # Once, at start: what scores this server's rollouts (``rollgym.server.fingerprint``).
        self.fingerprint = Fingerprint.of(type(self), self.data_files(), type(self).version)

    # -- the authoring API ---------------------------------------------------------------

    async def seed_session(self, session: Session) -> None:
        """Prepare per-rollout state in ``session.data`` (``session.task`` is the task row)."""

    async def verify(self, session: Session, task: dict[str, Any], response: dict[str, Any]) -> Any:
        """Score ``response`` for ``task``: a float reward, or a dict with ``reward`` and metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """Environment-level metrics over finished rollouts: their verify responses without
        ``response`` and ``responses_create_params`` (reward, metrics, task fields, indices).
        ``POST /aggregate_metrics`` answers them as the key metrics, in the shape of
        ``rollgym.server.aggregate``."""
        return {}

    def data_files(self) -> list[tuple[str, Path]] | None:
        """The data files this environment scores with, as (name, path): digested into its
        fingerprint at start. None (the default): the non-Python files of its package's
        folder (``rollgym.server.fingerprint``)."""
        return None

    def cpu_work(self) -> Callable[..., Any] | None:
        """The function this server hands to ``run_cpu``, if any. Then its pool is started as
        the server starts: every worker imports the function's module and runs that module's
        ``warm_up()`` if it has one. Spawning workers and importing take seconds, which
        neither the first verify nor a replay of the run (whose model answers at once) should
        wait for. Meanwhile ``/health`` answers 503 ``starting`` (``HEALTH_STARTING``): the
        launcher waits for it under its warm-up bound, not the 30 s start-up bound meant for a
        process that never answers (on a busy machine warming can take longer); a warm-up that
        fails answers ``failed``, and the launcher stops at once. None (the default): the pool
        starts at the first ``run_cpu``."""
        return None

    def health(self) -> dict[str, Any]:
        out = super().health()
        warming = self._warming
        if warming is not None and not warming.done():
            out.update(status=HEALTH_STARTING, starting=self._warming_what)
        elif self._warm_error is not None:
            out.update(status=HEALTH_FAILED, error=self._warm_error)
        return out

    def features(self) -> list[str]:
        overridden = type(self).aggregate_metrics is not ResourcesServer.aggregate_metrics
        return ["aggregate_metrics"] if overridden else []

    async def run_cpu(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> Any:
        """Run a CPU-bound, picklable ``fn`` in a process pool where a timeout can stop it.

        A call still running at its timeout fails with ``DeadlineExceeded`` (one that never
        left the queue with its subclass ``WaitedTooLong``); its pool takes no
        new work and is killed once its other calls have finished (a thread could not be
        stopped at all, and killing the pool at once would break its neighbours' calls).
        """
        timeout = self.verify_timeout if timeout is None else timeout
        pool = await self._cpu_pool(fn.__module__)
        job = pool.submit(fn, *args)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job), timeout)
        except TimeoutError:
            if job.cancel():
                # It never left the queue: nothing is stuck, the pool is fine.
                raise WaitedTooLong(
                    f"{type(self).__name__}: CPU work waited {timeout:g}s for a free worker",
                    server=self.name,
                ) from None
            if self._pool is pool:
                self._pool = None  # new work goes to a fresh pool
            task = asyncio.create_task(_retire(pool, job, timeout))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
            raise DeadlineExceeded(
                f"{type(self).__name__}: CPU work did not finish within {timeout:g}s",
                server=self.name,
            ) from None
        except BrokenProcessPool:
            if self._pool is pool:
                self._pool = None
            raise

    async def _cpu_pool(self, module: str) -> CpuPool:
        """The current pool, started and warmed first: spawning workers and importing the
        function's module takes seconds, which must not count against a call's timeout."""
        async with self._pool_lock:
            if self._pool is None:
                pool = CpuPool(self.cpu_verify_workers)
                warmed = [pool.submit(warm, module) for _ in range(self.cpu_verify_workers)]
                gathered = asyncio.gather(*map(asyncio.wrap_future, warmed))
                try:
                    await asyncio.wait_for(gathered, WARM_UP_TIMEOUT)
                except BaseException:
                    pool.kill()  # its workers would otherwise outlive the failed warm-up
                    # Its calls, cancelled by the kill, end the gather later with an error
                    # nobody awaits: read here, not logged by asyncio as an ERROR.
                    gathered.add_done_callback(_read_outcome)
                    raise
                self._pool = pool
            return self._pool

    async def startup(self) -> None:
        await super().startup()
        work = self.cpu_work()
        if work is not None:
            # In the background: ``/health`` says ``starting`` meanwhile (see ``cpu_work``).
            self._warming_what = (
                f"warming {self.cpu_verify_workers} scoring worker(s) ({work.__module__})"
            )
            self._warming = asyncio.create_task(self._warm_up(work.__module__))

    async def warmed(self) -> None:
        """Return once the scoring pool started with the server has warmed up, or failed to
        (then ``/health`` says ``failed``); at once when there is none."""
        if self._warming is not None:
            await asyncio.shield(self._warming)  # ``_warm_up`` raises nothing

    async def _warm_up(self, module: str) -> None:
        try:
            await self._cpu_pool(module)
        except Exception as exc:  # said by /health (``failed``), where the launcher reads it
            if isinstance(exc, TimeoutError):
                why = f"not done within {WARM_UP_TIMEOUT:g}s"
            else:
                why = f"{type(exc).__name__}: {exc}"
            self._warm_error = f"{self._warming_what} failed: {why}"[:2000]
            log.error("%s", self._warm_error)

    # -- transport -----------------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/seed_session", json_endpoint(self._seed, self._seed_limit()), methods=["POST"]),
            *self._dialect_routes,
            Route(REVERIFY_MODE_ENDPOINT, json_endpoint(self._reverify_mode), methods=["GET"]),
            fingerprint_route(self.fingerprint),
            Route("/verify", json_endpoint(self._verify), methods=["POST"]),
            Route("/aggregate_metrics", json_endpoint(self._aggregate), methods=["POST"]),
            Route("/tools", json_endpoint(self._list_tools), methods=["GET", "POST"]),
            *(
                Route(f"/{name}", json_endpoint(self._tool_endpoint(name)), methods=["POST"])
                for name in self.tools
            ),
        ]

    async def shutdown(self) -> None:
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()  # its pool is killed as it unwinds (``_cpu_pool``)
            with contextlib.suppress(asyncio.CancelledError):
                await self._warming
        # Kill, not shut down: a worker stuck in a verifier would otherwise spin on.
        for task in self._retiring:
            task.cancel()
        if self._pool is not None:
            self._pool.kill()
            self._pool = None
        await super().shutdown()

    def _seed_limit(self) -> BodyLimit:
        limits = self.ctx.config.limits
        return BodyLimit(limits.seed_bytes, f"servers.{self.name}.limits.seed_bytes")

    async def _list_tools(self, body: Any, call: Call) -> Any:
        return [spec.schema() for spec in self.tools.values()]

    async def _reverify_mode(self, body: Any, call: Call) -> Any:
        return type(self).reverify_mode

    async def _seed(self, task: Any, call: Call) -> Any:
        if not isinstance(task, dict):
            raise InvalidRequest("seed_session expects the task row as a JSON object", status=422)
        for dialect in self.dialects:
            if dialect.takes(task):
                opened, answer = await dialect.seed(
                    task, call.size, self._sessions, self.seed_session
                )
                return in_session(answer, opened)
        session = new_session(task, call.size)
        await self.seed_session(session)
        self._sessions.hold(session)
        return in_session({"session_id": session.id}, session)

    def _session(self, call: Call) -> Session:
        sid = session_id(call)
        if not sid:
            # A stateless call (no seed_session) gets a throwaway session.
            return Session(id="", task={})
        session = self._sessions.get(sid)
        if session is None:
            raise InvalidRequest(
                f"unknown session {sid!r} (not seeded, already verified, or closed"
                f"{self._sessions.why_missing()})",
                status=404,
            )
        return session

    def _tool_endpoint(self, name: str) -> Handler:
        spec = self.tools[name]
        method = getattr(self, spec.method_name)

        async def call_tool(raw: Any, call: Call) -> Any:
            session = self._session(call)
            try:
                result = await method(session, **_arguments(spec, raw))
            except InvalidRequest as err:
                if not session.id:
                    raise
                # A refused call is an answer the agent hands back to the model, and the
                # rollout goes on: it must keep its session cookie like any other answer.
                refused = error_response(self.name, err)
                refused.headers["set-cookie"] = session_cookie(session.id)
                return refused
            return in_session(result, session)

        return call_tool

    async def _verify(self, body: Any, call: Call) -> Any:
        if not isinstance(body, dict) or not isinstance(body.get("response"), dict):
            raise InvalidRequest("verify expects the task row plus a 'response' object", status=422)
        session = self._session(call)
        if not session.task:
            session.task = body
        response = body["response"]
        spent: dict[str, Any] = {}
        token = _SPENT.set(spent)
        try:
            result = await self.verify(session, body, response)
        except RollgymError as err:
            if not spent:
                raise
            # Answered as any error, with what the verify spent before it failed beside it.
            if not isinstance(err, InvalidRequest):  # as the app logs the errors it answers
                log.warning("POST /verify failed: %s", err)
            return error_response(self.name, err, {COST_FIELD: spent})
        finally:
            _SPENT.reset(token)
        # Dropped only once verified, so a retried /verify (idempotent) still finds it; a named
        # session only when its caller closes it.
        if session.name is None:
            self._sessions.release(session)
        if isinstance(result, dict):
            if "reward" not in result:
                raise InternalError(
                    f"{type(self).__name__}.verify returned a dict without 'reward'"
                )
            out = {**body, **result}
        else:
            out = {**body, "reward": float(result)}
        out["reward"] = float(out["reward"])
        return JSONResponse(out)

    async def _aggregate(self, body: Any, call: Call) -> Any:
        if isinstance(body, dict) and "verify_responses" not in body and "rollouts" in body:
            # rollgym's first shape, kept for older callers: the hook's own metrics only.
            return await self.aggregate_metrics(_rollouts(body["rollouts"]))
        try:
            request = AggregateMetricsRequest.model_validate(body)
        except ValidationError as exc:
            message = format_validation_error("aggregate_metrics", exc, one_line=True)
            raise InvalidRequest(message, status=422) from None
        # The environment's own metrics over the measured rows only: a masked row's reward is
        # no measurement.
        own = await self.aggregate_metrics(measured(request.verify_responses))
        if not isinstance(own, dict):
            raise InternalError(f"{type(self).__name__}.aggregate_metrics returned no dict")
        return aggregate(request.verify_responses, own).model_dump()


def _rollouts(raw: Any) -> list[dict[str, Any]]:
    if not (isinstance(raw, list) and all(isinstance(r, dict) for r in raw)):
        raise InvalidRequest("aggregate_metrics: 'rollouts' must be a list of objects", status=422)
    return raw


def _arguments(spec: ToolSpec, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"tool {spec.name} expects a JSON object of arguments", status=422)
    try:
        return dict(spec.arguments.model_validate(raw))
    except ValidationError as exc:
        message = format_validation_error(f"bad arguments for tool {spec.name}", exc, one_line=True)
        raise InvalidRequest(message, status=422) from None


def _read_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _retire(pool: CpuPool, stuck: Future[Any], grace: float) -> None:
    """Kill ``pool`` once every call but the stuck one has finished (or after ``grace`` more
    seconds, since each of those calls has its own timeout too)."""
    try:
        # The pool takes no new work once retired: the calls to wait for are known now.
        others = [asyncio.wrap_future(f) for f in pool.others(stuck)]
        if others:
            await asyncio.wait(others, timeout=grace)
    finally:  # also when cancelled at shutdown
        pool.kill()


__all__ = [
    "ResourcesDialect",
    "ResourcesServer",
    "ReverifyMode",
    "Session",
    "dialects_of",
    "output_text",
    "tool",
    "verify_spent",
]
