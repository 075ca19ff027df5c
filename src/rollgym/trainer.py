"""The trainer-facing API: a batch of task rows in, one record per rollout out, grouped by task.

    client = RolloutClient("http://10.0.0.5:8000")          # the agent server (or its replicas)
    groups = client.collect_sync(rows, repeats=8)           # or: await client.collect(...)
    for group in groups:                                    # one per row, in input order
        rewards = group.rewards                             # scored rollouts only

Each record is a ``ScoredRollout`` (reward, the verified response, every field the verifier and
the model server attached) or a ``FailedRollout`` holding the typed ``RollgymError``. A failure
never cancels its siblings and is never a reward of 0. Records are plain frozen dataclasses: they
pickle, so they cross a ``spawn`` process or a Ray actor boundary (``ray.get``) unchanged.

With ``strict=True`` the first failure raises its error instead and the batch's other rollouts
are cancelled. Raised from a Ray actor, the error reaches the driver as ``RayTaskError(<ours>)``,
which Ray makes an instance of our class too, every field readable (``except HTTPStatusError as
e: e.status, e.server, e.body``); ``plain_error(e)`` gives back the original error object.

This module never imports Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import orjson

from rollgym.config import RetryPolicy, kind_defaults
from rollgym.errors import InternalError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.protocol import HEADER_ROLLOUT, RolloutFailure, RolloutResult, check_verified

log = logging.getLogger("rollgym.trainer")

T = TypeVar("T")

__all__ = [
    "FailedRollout",
    "RolloutClient",
    "RolloutRecord",
    "ScoredRollout",
    "TaskGroup",
    "collect_batch",
    "collect_batch_sync",
    "plain_error",
    "run_rollout",
]


# -- records ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScoredRollout:
    """A rollout that ran to the verifier. ``verified`` is the verify response: the task's
    fields, ``response`` (with any token-level fields the model server attached) and metrics."""

    task_index: int
    rollout_index: int
    reward: float
    attempts: int
    duration_s: float
    verified: dict[str, Any]
    ok: Literal[True] = field(default=True, init=False)

    @property
    def response(self) -> dict[str, Any]:
        """The final Responses API response object of the rollout."""
        response = self.verified.get("response")
        return response if isinstance(response, dict) else {}

    @property
    def metrics(self) -> dict[str, float]:
        """The verifier's other numeric top-level fields (DESIGN.md: they are metrics)."""
        skip = ("reward", "task_index", "rollout_index")
        return {
            k: float(v)
            for k, v in self.verified.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    def to_ledger(self) -> RolloutResult:
        """This record as a line of ``rollouts.jsonl``."""
        return RolloutResult(
            self.task_index,
            self.rollout_index,
            self.reward,
            self.attempts,
            self.duration_s,
            self.verified,
        )


@dataclass(frozen=True, slots=True)
class FailedRollout:
    """A rollout that could not finish: the typed error, and how many times it was tried."""

    task_index: int
    rollout_index: int
    error: RollgymError
    attempts: int
    duration_s: float
    ok: Literal[False] = field(default=False, init=False)

    @property
    def retryable(self) -> bool:
        return self.error.retryable

    def to_ledger(self) -> RolloutFailure:
        """This record as a line of ``failures.jsonl``."""
        return RolloutFailure(
            self.task_index,
            self.rollout_index,
            self.attempts,
            self.duration_s,
            self.error.to_dict(),
        )


RolloutRecord = ScoredRollout | FailedRollout


@dataclass(frozen=True, slots=True)
class TaskGroup:
    """All rollouts of one task row (its GRPO group), ordered by ``rollout_index``."""

    task_index: int
    task: dict[str, Any]
    rollouts: tuple[RolloutRecord, ...]

    @property
    def scored(self) -> list[ScoredRollout]:
        return [r for r in self.rollouts if isinstance(r, ScoredRollout)]

    @property
    def failed(self) -> list[FailedRollout]:
        return [r for r in self.rollouts if isinstance(r, FailedRollout)]

    @property
    def rewards(self) -> list[float]:
        """Rewards of the scored rollouts (failed ones have none: they are not zeros)."""
        return [r.reward for r in self.scored]

    @property
    def complete(self) -> bool:
        """Every rollout of the group was scored."""
        return all(r.ok for r in self.rollouts)


def plain_error(exc: BaseException) -> BaseException:
    """The rollgym error inside a ``RayTaskError(<ours>)`` (Ray's dual class, which pickle cannot
    send on by reference), or ``exc`` itself."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, RollgymError) and isinstance(cause, RollgymError):
        return cause
    return exc


# -- one rollout ------------------------------------------------------------------------------


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


async def run_rollout(
    http: HttpClient,
    target: Target,
    row: bytes | dict[str, Any],
    task_index: int,
    rollout_index: int,
    *,
    timeout: float,
    max_attempts: int = 1,
    prior_attempts: int = 0,
    may_retry: Callable[[], bool] | None = None,
) -> RolloutRecord:
    """Run one rollout through the agent's ``/run`` and return its record; never raises a
    ``RollgymError`` (only cancellation). ``row`` as bytes is sent as is (already stamped with
    its indices); a retryable failure is run again while attempts, counted from
    ``prior_attempts``, stay below ``max_attempts`` and ``may_retry()`` allows."""
    if isinstance(row, dict):
        row = orjson.dumps({**row, "task_index": task_index, "rollout_index": rollout_index})
    key = f"{task_index}:{rollout_index}"
    headers = {HEADER_ROLLOUT: key}
    attempts = prior_attempts
    started = time.monotonic()
    while True:
        attempts += 1
        try:
            answer = await http.call(
                target, "/run", row, headers=headers, deadline=timeout, sticky=key
            )
            verified = check_verified(answer, target.name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            err = exc if isinstance(exc, RollgymError) else _internal(exc)
            if err.retryable and attempts < max_attempts and (may_retry is None or may_retry()):
                continue
            return FailedRollout(
                task_index, rollout_index, err, attempts, time.monotonic() - started
            )
        reward = float(verified["reward"])
        return ScoredRollout(
            task_index, rollout_index, reward, attempts, time.monotonic() - started, verified
        )


def _internal(exc: BaseException) -> RollgymError:
    log.exception("unexpected error in a rollout", exc_info=exc)
    return InternalError(f"trainer: {type(exc).__name__}: {exc}", server="collector")


# -- the client -------------------------------------------------------------------------------


class RolloutClient:
    """Calls an agent server for batches of task rows. Make one per trainer process and reuse
    it every step: it keeps a connection pool per event loop, and the sync methods run on a
    private event-loop thread, so a synchronous training loop reuses connections too.

    ``agent``: the agent's URL, its replica URLs (spread by least outstanding requests), or a
    ``Target``. Pickling a client sends only its target (a Ray actor rebuilds its own pools).
    """

    def __init__(
        self,
        agent: str | Sequence[str] | Target,
        *,
        name: str = "agent",
        connections: int = 4096,
    ) -> None:
        self.target = agent_target(agent, name)
        self._connections = connections
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpClient] = (
            weakref.WeakKeyDictionary()
        )
        self._thread: _LoopThread | None = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_client, (self.target, self._connections))

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
    ) -> RolloutRecord:
        """One rollout of ``row``, as a record (never raises a ``RollgymError``)."""
        return await run_rollout(
            self.http(), self.target, row, task_index, rollout_index,
            timeout=rollout_timeout, max_attempts=attempts,
        )  # fmt: skip

    async def collect(
        self,
        rows: Iterable[dict[str, Any]],
        *,
        repeats: int = 1,
        concurrency: int = 64,
        rollout_timeout: float = 600.0,
        attempts: int = 1,
        strict: bool = False,
    ) -> list[TaskGroup]:
        """Run ``repeats`` rollouts of every row, at most ``concurrency`` at once; return one
        ``TaskGroup`` per row, in order. Row ``i`` is task ``i`` of the batch. A rollout whose
        failure is retryable is tried up to ``attempts`` times. ``strict``: raise the first
        failure's error and cancel the other rollouts."""
        tasks = [dict(row) for row in rows]
        if repeats < 1 or concurrency < 1 or attempts < 1:
            raise ValueError("repeats, concurrency and attempts must be at least 1")
        http = self.http()
        gate = asyncio.Semaphore(concurrency)

        async def one(task_index: int, rollout_index: int) -> RolloutRecord:
            async with gate:
                record = await run_rollout(
                    http, self.target, tasks[task_index], task_index, rollout_index,
                    timeout=rollout_timeout, max_attempts=attempts,
                )  # fmt: skip
            if strict and isinstance(record, FailedRollout):
                raise record.error
            return record

        jobs = [asyncio.create_task(one(t, r)) for t in range(len(tasks)) for r in range(repeats)]
        try:
            if strict:
                error = await _first_error(jobs)
                if error is not None:
                    raise error
            records = await asyncio.gather(*jobs)
        finally:
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
        return [
            TaskGroup(t, tasks[t], tuple(records[t * repeats : (t + 1) * repeats]))
            for t in range(len(tasks))
        ]

    def collect_sync(self, rows: Iterable[dict[str, Any]], **options: Any) -> list[TaskGroup]:
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


def _rebuild_client(target: Target, connections: int) -> RolloutClient:
    return RolloutClient(target, connections=connections)


async def _first_error(jobs: list[asyncio.Task[RolloutRecord]]) -> BaseException | None:
    """Wait until every job is done or one raised; return the first error (None if none)."""
    pending: set[asyncio.Task[RolloutRecord]] = set(jobs)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for job in done:
            if not job.cancelled() and job.exception() is not None:
                return job.exception()
    return None


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


# -- one-call forms ---------------------------------------------------------------------------


async def collect_batch(
    rows: Iterable[dict[str, Any]],
    *,
    agent: str | Sequence[str] | Target | RolloutClient,
    repeats: int = 1,
    concurrency: int = 64,
    rollout_timeout: float = 600.0,
    attempts: int = 1,
    strict: bool = False,
) -> list[TaskGroup]:
    """One batch: ``repeats`` rollouts of every row through ``agent`` (a ``RolloutClient`` to
    reuse connections across steps, or a URL / replica URLs / ``Target``). See
    ``RolloutClient.collect``."""
    options: dict[str, Any] = {
        "repeats": repeats, "concurrency": concurrency, "rollout_timeout": rollout_timeout,
        "attempts": attempts, "strict": strict,
    }  # fmt: skip
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
    repeats: int = 1,
    concurrency: int = 64,
    rollout_timeout: float = 600.0,
    attempts: int = 1,
    strict: bool = False,
) -> list[TaskGroup]:
    """``collect_batch`` for synchronous code; safe to call where an event loop is running."""
    options: dict[str, Any] = {
        "repeats": repeats, "concurrency": concurrency, "rollout_timeout": rollout_timeout,
        "attempts": attempts, "strict": strict,
    }  # fmt: skip
    if isinstance(agent, RolloutClient):
        return agent.collect_sync(rows, **options)
    with RolloutClient(agent) as client:
        return client.collect_sync(rows, **options)
