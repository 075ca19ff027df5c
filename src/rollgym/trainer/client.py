"""``RolloutClient``: a batch of task rows through the rollout core, one ``TaskGroup`` per row;
``stream`` starts a ``RolloutStream``; ``collect_batch`` and ``SyncStream`` for the other ways
in. What it promises is the package's docstring (``rollgym.trainer``). It never imports Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterable, Coroutine, Iterable, Sequence
from typing import Any, TypedDict, TypeVar, Unpack

import orjson

from rollgym.collect.dialect import Dialects
from rollgym.collect.dispatch import LocalDispatcher
from rollgym.collect.failure_budget import BudgetRules, FailureBudget
from rollgym.collect.launchers import check_reachable
from rollgym.collect.recorder import MemorySink, Recorder
from rollgym.collect.records import (
    RolloutItem,
    RolloutRecord,
    checked,
    tagged,
)
from rollgym.collect.rollout import RolloutPolicy, RolloutRunner
from rollgym.config import RetryPolicy, kind_defaults
from rollgym.dialects import ROW_DIALECTS
from rollgym.errors import RollgymError, RunAborted
from rollgym.http import HttpClient, Target
from rollgym.trainer.group import TaskGroup
from rollgym.trainer.policy_control import PauseAnswer
from rollgym.trainer.stream import RolloutStream

T = TypeVar("T")

DEFAULT_BUDGET = BudgetRules()
"""The run's default failure budget (abort at a 50% failure rate after 50 rollouts, or at a
401/403/404 among the first 5), applied to each batch."""


def plain_error(exc: BaseException) -> BaseException:
    """The rollgym error inside a ``RayTaskError(<ours>)`` (Ray's dual class, which pickle cannot
    send on by reference), or ``exc`` itself."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, RollgymError) and isinstance(cause, RollgymError):
        return cause
    return exc


def agent_target(agent: str | Sequence[str] | Target, name: str = "agent") -> Target:
    """A ``Target`` for an agent server given by URL, replica URLs, or a ready ``Target``; the
    policy is the agent default: ``/run`` is tried once (it is not safe to replay)."""
    if isinstance(agent, Target):
        return agent
    urls = (agent,) if isinstance(agent, str) else tuple(agent)
    if not urls:
        raise ValueError("an agent needs at least one URL")
    policy = RetryPolicy.model_validate(kind_defaults("agent"))
    return Target(name, tuple(u.rstrip("/") for u in urls), policy)


def _item(row: dict[str, Any], task_index: int, rollout_index: int, agent: str) -> RolloutItem:
    stamped = orjson.dumps({**row, "task_index": task_index, "rollout_index": rollout_index})
    return RolloutItem(task_index, rollout_index, stamped, agent)


# -- the client -------------------------------------------------------------------------------


class RolloutClient:
    """Calls an agent server for batches of task rows. Make one per trainer process and reuse
    it every step: it keeps a connection pool per event loop, and the sync methods run on a
    private event-loop thread, so a synchronous training loop reuses connections too.

    ``agent``: the agent's URL, its replica URLs (spread by least outstanding requests), or a
    ``Target``. Pickling a client sends only its target and switches (a Ray actor rebuilds its
    own pools).

    ``mask_exploits``: mask the rollouts whose integrity verdict is ``exploit``
    (``rollgym.audit.scan``), as ``collect.mask_exploits`` does in a run: ``r.masked`` true and
    ``r.integrity["masked"]`` true, the reward kept but in no ``group.rewards`` (never a 0).
    Off by default: records are tagged (``r.integrity``) either way. ``collect`` and ``stream``
    take it per call too.
    """

    def __init__(
        self,
        agent: str | Sequence[str] | Target,
        *,
        name: str = "agent",
        connections: int = 4096,
        mask_exploits: bool = False,
    ) -> None:
        self.target = agent_target(agent, name)
        self.mask_exploits = mask_exploits
        self._connections = connections
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpClient] = (
            weakref.WeakKeyDictionary()
        )
        self._thread: _LoopThread | None = None
        self._lock = threading.Lock()
        self._checked: weakref.WeakSet[HttpClient] = weakref.WeakSet()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_client, (self.target, self._connections, self.mask_exploits))

    def __repr__(self) -> str:
        return f"RolloutClient({self.target.name!r}, urls={list(self.target.urls)!r})"

    def http(self) -> HttpClient:
        """The connection pool of the running event loop (aiohttp sessions belong to a loop)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = HttpClient(limit=self._connections)
        return pool

    async def run(
        self,
        row: dict[str, Any],
        task_index: int = 0,
        rollout_index: int = 0,
        *,
        rollout_timeout: float = 600.0,
        attempts: int = 1,
        mask_exploits: bool | None = None,
    ) -> RolloutRecord:
        """One rollout of ``row``, as a record (never raises a ``RollgymError``);
        ``mask_exploits``: None for the client's."""
        runner = RolloutRunner(
            self.http(),
            {self.target.name: self.target},
            RolloutPolicy(rollout_timeout, attempts),
            dialects=Dialects(ROW_DIALECTS),
        )
        # No recorder on this path: the record is checked and tagged here as the recorder does.
        ran = await runner.run(_item(row, task_index, rollout_index, self.target.name))
        mask = self.mask_exploits if mask_exploits is None else mask_exploits
        return tagged(checked(ran), mask)

    async def collect(
        self,
        rows: Iterable[dict[str, Any]],
        *,
        repeats: int = 1,
        concurrency: int = 64,
        rollout_timeout: float = 600.0,
        attempts: int = 1,
        strict: bool = False,
        budget: BudgetRules | None = DEFAULT_BUDGET,
        mask_exploits: bool | None = None,
    ) -> list[TaskGroup]:
        """Run ``repeats`` rollouts of every row, at most ``concurrency`` at once; return one
        ``TaskGroup`` per row, in order. Row ``i`` is task ``i`` of the batch. A rollout whose
        failure is retryable is tried up to ``attempts`` times.

        Like a run: the agent must answer before anything is sent (else ``LaunchError``); a
        rollout refused by an open circuit is held and re-sent; when ``budget`` says the
        servers are broken the batch's other rollouts are cancelled and ``RunAborted`` is
        raised with the failure summary as its body (``budget=None``: never). ``strict``:
        raise the first failure's own error instead, at once. ``mask_exploits``: None for the
        client's (see the class)."""
        tasks = [dict(row) for row in rows]
        if repeats < 1 or concurrency < 1 or attempts < 1:
            raise ValueError("repeats, concurrency and attempts must be at least 1")
        http = self.http()
        await self._check_started(http)
        name = self.target.name
        items = (_item(tasks[t], t, r, name) for t in range(len(tasks)) for r in range(repeats))
        sink = MemorySink()
        rules = BudgetRules(max_failures=1, max_failure_rate=None) if strict else budget
        budget_ = None if rules is None else FailureBudget(rules.for_concurrency(concurrency))
        mask = self.mask_exploits if mask_exploits is None else mask_exploits
        recorder = Recorder(sink, budget_, mask_exploits=mask)
        dispatcher = LocalDispatcher(
            RolloutPolicy(rollout_timeout, attempts), concurrency, dialects=Dialects(ROW_DIALECTS)
        )
        recorder.on_abort(dispatcher.cancel)
        await dispatcher.start(http, {name: self.target})
        try:
            await dispatcher.dispatch(items, len(tasks) * repeats, recorder)
        finally:
            dispatcher.cancel()  # an interrupted batch leaves nothing running
        if recorder.abort_reason is not None:
            if strict and sink.first_failure is not None:
                raise sink.first_failure.error
            assert recorder.budget is not None
            summary = recorder.budget.summary.to_dict()
            raise RunAborted(
                f"batch aborted: {recorder.abort_reason}", server=name, body=orjson.dumps(summary)
            )
        records = sink.records
        return [
            TaskGroup(t, tasks[t], tuple(records[(t, r)] for r in range(repeats)))
            for t in range(len(tasks))
        ]

    async def _check_started(self, http: HttpClient) -> None:
        """The agent must answer at all before a batch is sent to it (once per client and
        loop): a wrong URL fails fast as ``LaunchError``, not as a batch of failed rollouts."""
        if http in self._checked:
            return
        await check_reachable(http, {self.target.name: list(self.target.urls)})
        self._checked.add(http)

    def stream(
        self, rows: Iterable[dict[str, Any]] | AsyncIterable[dict[str, Any]], **options: Any
    ) -> RolloutStream:
        """Groups as they finish, for asynchronous training: an async iterator over
        ``TaskGroup``s in completion order, with back-pressure, a failure rule, bounded
        staleness and pause/resume (``rollgym.trainer.stream.RolloutStream`` has the options)."""
        return RolloutStream(self, rows, **options)

    def stream_sync(self, rows: Iterable[dict[str, Any]], **options: Any) -> SyncStream:
        """``stream`` for a synchronous trainer: iterate it in a ``with`` block; it runs on
        the client's private event-loop thread."""
        with self._lock:
            if self._thread is None:
                self._thread = _LoopThread()
            thread = self._thread
        return SyncStream(thread, RolloutStream(self, rows, **options))

    def collect_sync(
        self, rows: Iterable[dict[str, Any]], **options: Unpack[BatchOptions]
    ) -> list[TaskGroup]:
        """``collect`` for synchronous code (a trainer step, a sync Ray actor method)."""
        return self._run_sync(self.collect(list(rows), **options))

    def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = _LoopThread()
            thread = self._thread
        return thread.run(coro)

    async def aclose(self) -> None:
        """Close the pool of the running loop (and the private loop thread, if any)."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()
        self._close_thread()

    def close(self) -> None:
        """Close the private loop thread and its pool (pools of other loops close with them)."""
        self._close_thread()

    def _close_thread(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.run(self._close_pool())
            thread.stop()

    async def _close_pool(self) -> None:
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _rebuild_client(target: Target, connections: int, mask_exploits: bool = False) -> RolloutClient:
    return RolloutClient(target, connections=connections, mask_exploits=mask_exploits)


class _LoopThread:
    """An event loop on a daemon thread, for the sync API: connections outlive one call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="rollgym-trainer-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("collect_sync called from its own loop; use `await collect(...)`")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted (KeyboardInterrupt) or failed: make sure no rollout keeps running.
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self.loop.close()


class SyncStream:
    """A ``RolloutStream`` for synchronous code: an iterator of ``TaskGroup``s, with ``pause``
    and ``resume``; ``close`` (or leaving the ``with`` block) stops it."""

    def __init__(self, thread: _LoopThread, stream: RolloutStream) -> None:
        self._thread = thread
        self.stream = stream

    def __iter__(self) -> SyncStream:
        return self

    def __next__(self) -> TaskGroup:
        try:
            return self._thread.run(self.stream.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def pause(self, *, abort: bool = False, timeout_s: float | None = None) -> list[PauseAnswer]:
        return self._thread.run(self.stream.pause(abort=abort, timeout_s=timeout_s))

    def resume(self, version: int) -> None:
        self._thread.run(self.stream.resume(version))

    def close(self) -> None:
        self._thread.run(self.stream.aclose())

    def __enter__(self) -> SyncStream:
        self._thread.run(self.stream.__aenter__())  # the with block owns it, as async with does
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- one-call forms ---------------------------------------------------------------------------


class BatchOptions(TypedDict, total=False):
    """The options of ``RolloutClient.collect`` (see there), for the one-call forms."""

    repeats: int
    concurrency: int
    rollout_timeout: float
    attempts: int
    strict: bool
    budget: BudgetRules | None
    mask_exploits: bool | None


async def collect_batch(
    rows: Iterable[dict[str, Any]],
    *,
    agent: str | Sequence[str] | Target | RolloutClient,
    **options: Unpack[BatchOptions],
) -> list[TaskGroup]:
    """One batch: ``repeats`` rollouts of every row through ``agent`` (a ``RolloutClient`` to
    reuse connections across steps, or a URL / replica URLs / ``Target``). See
    ``RolloutClient.collect`` for the options."""
    if isinstance(agent, RolloutClient):
        return await agent.collect(rows, **options)
    client = RolloutClient(agent)
    try:
        return await client.collect(rows, **options)
    finally:
        await client.aclose()


def collect_batch_sync(
    rows: Iterable[dict[str, Any]],
    *,
    agent: str | Sequence[str] | Target | RolloutClient,
    **options: Unpack[BatchOptions],
) -> list[TaskGroup]:
    """``collect_batch`` for synchronous code; safe to call where an event loop is running."""
    if isinstance(agent, RolloutClient):
        return agent.collect_sync(rows, **options)
    with RolloutClient(agent) as client:
        return client.collect_sync(rows, **options)
