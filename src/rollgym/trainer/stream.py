"""The streaming trainer API: groups in the order they finish, for asynchronous RL.

    async with client.stream(rows, repeats=16, concurrency=1024, max_staleness=1,
                             control=PolicyControl(model_urls)) as stream:
        async for group in stream:             # a TaskGroup as soon as all its repeats are in
            batch.append(group)
            if len(batch) == 256:
                await stream.pause(abort=True)  # hold model calls; swap the weights
                train(batch); batch = []
                await stream.resume(version)    # the new weights are live

``rows``: an iterable (read on the event loop: it must not block) or an async iterable of task
rows; rows may keep arriving (an async queue the trainer fills). Row ``i`` (in arrival order) is task ``i``; its ``repeats`` rollouts are sent
together and its ``TaskGroup`` is yielded when every one of them has its record, whatever the
order rows were given in.

Bounded at any run length (counts, not time):
- at most ``concurrency`` rollouts in flight (the dispatcher's workers);
- at most ``max_ahead`` groups started and not yet taken by the consumer (running, or finished
  and waiting): when the consumer does not take them, no new row is started (back-pressure);
  rollouts in flight finish, re-runs of started groups still go, so the open groups can finish
  and nothing is half-done. So at most ``max_ahead`` finished groups ever wait, and a trainer
  that takes a step's worth of groups per step is never more than ``max_ahead`` groups ahead of
  itself (default: twice ``concurrency / repeats``, so groups held open by one slow rollout
  leave room for new ones);
- a consumer that takes no group for ``consumer_timeout`` seconds while the stream waits for it
  ends the stream: the next ``__anext__`` raises ``RunAborted`` saying so.

A group's failed rollouts follow ``on_failure``:
- ``"partial"`` (default): the group is yielded with its failures typed (``group.failed``);
- ``"drop"``: a group that is not ``complete`` is not yielded (counted in ``stats``);
- ``"rerun"``: a failed rollout is run again with a fresh ``rollout_index`` (``repeats`` and
  up), each repeat at most ``max_reruns`` times; what still fails is yielded typed. The records
  a re-run replaced are in ``group.replaced``.

Bounded staleness (``max_staleness=k``; ``rollgym.trainer.staleness``): a rollout whose oldest
model call is more than ``k`` versions behind the live version is cancelled in flight (by the
model servers, told ``k`` at each ``resume``), discarded on arrival, or discarded as its group
leaves for the trainer (it may have waited in the buffer across a resume: every group the
trainer gets is within ``k`` of the version live when it takes it), and recorded as a stale
outcome (``group.stale``; never counted by the failure budget). With ``rerun_stale`` (default)
the rollout is run again with a fresh rollout index, each repeat at most ``max_stale_reruns``
times.

Pause and resume (``control``: a ``PolicyControl`` for the model servers): ``pause`` holds new
rollouts and every model call (``abort=True``: aborts the calls in flight, which the model
servers re-issue after the resume, from the same conversation state); ``resume(version)`` makes
``version`` live (the version staleness is judged by) and releases them. Environment calls are
not paused. Deadlines:
- a pause has one (``timeout_s``, default ``max_pause``): a stream still paused past it ends,
  and ``__anext__`` raises ``PausedTooLong`` (the model servers fail their held calls the same
  way at the same deadline); a model server that does not answer a pause or resume raises its
  typed error from ``pause``/``resume`` within ``PolicyControl.call_timeout``;
- a rollout's deadline is ``rollout_timeout + max_pause``: one pause of at most ``max_pause``
  never expires a rollout that was on time. (A rollout caught in several pauses may.)

Lifetime: ``async with client.stream(...) as stream`` owns the stream (a loop over it may
``break`` and a later loop go on, and ``pause``/``resume`` work after its last group; leaving
the context closes it). A stream iterated bare (``async for group in client.stream(...)``) is
closed when that loop is left, by ``break`` or an exception as much as by its end (asyncio closes
the loop's async generator, at once or at the loop's next turn): nothing keeps running for a
consumer that forgets. ``pause`` or ``resume`` on a closed stream raises ``RuntimeError``.

Every rollout runs through the one rollout core (``RolloutRunner``, via a ``LocalDispatcher``,
or ``dispatcher=RayDispatcher`` for Ray worker actors) and the one ``Recorder`` with the failure
budget; ``output=DIR`` writes its run directory (``rollgym.trainer.stream_ledger``). Each
dispatched rollout gets exactly one record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from rollgym.collect.dialect import Dialects
from rollgym.collect.dispatch import FeedDispatcher, LocalDispatcher
from rollgym.collect.failure_budget import BudgetRules, FailureBudget
from rollgym.collect.launchers import check_reachable
from rollgym.collect.recorder import Recorder
from rollgym.collect.records import RolloutItem
from rollgym.collect.rollout import RolloutPolicy
from rollgym.dialects import ROW_DIALECTS
from rollgym.errors import PausedTooLong, RollgymError, RunAborted
from rollgym.server.fingerprint import AGENT_ASK_TIMEOUT, ask_replicas, refuse_mixed
from rollgym.trainer.feed import GroupFeed, OnFailure, OpenGroup, StreamStats
from rollgym.trainer.group import TaskGroup
from rollgym.trainer.policy_control import PauseAnswer, PolicyControl
from rollgym.trainer.staleness import StalenessJudge
from rollgym.trainer.stream_ledger import StreamLedger

if TYPE_CHECKING:
    from rollgym.http import HttpClient, Target


class StreamClient(Protocol):
    """What a stream needs of its ``RolloutClient``: the agent it sends to, and the client's
    HTTP client (the stream's own module does not import the client's: the client makes
    streams)."""

    @property
    def target(self) -> Target: ...

    def http(self) -> HttpClient: ...


log = logging.getLogger("rollgym.stream")

DispatcherFactory = Callable[[RolloutPolicy, int], FeedDispatcher]
"""Makes the stream's dispatcher from (policy, concurrency): ``LocalDispatcher`` (default) or
``rollgym.ray.RayDispatcher``."""

MAX_PAUSE = 600.0
WATCH_TICK = 0.25
"""Seconds between the watchdog's looks at the pause and consumer deadlines."""


class RolloutStream:
    """An async iterator over ``TaskGroup``s in completion order (the behaviour as a whole is
    ``rollgym.trainer.stream``'s docstring). Make one with ``RolloutClient.stream``; use it as
    ``async with`` (then loops may stop and go on; the context closes it), or iterate it bare
    (leaving the loop closes it)."""

    def __init__(
        self,
        client: StreamClient,
        rows: Iterable[dict[str, Any]] | AsyncIterable[dict[str, Any]],
        *,
        repeats: int = 1,
        concurrency: int = 256,
        max_ahead: int | None = None,
        on_failure: OnFailure = "partial",
        max_reruns: int = 2,
        max_staleness: int | None = None,
        rerun_stale: bool = True,
        max_stale_reruns: int = 2,
        control: PolicyControl | None = None,
        version: int | None = None,
        rollout_timeout: float = 600.0,
        max_pause: float = MAX_PAUSE,
        attempts: int = 1,
        budget: BudgetRules | None = BudgetRules(),
        consumer_timeout: float | None = None,
        output: str | Path | None = None,
        dispatcher: DispatcherFactory | None = None,
        mask_exploits: bool | None = None,
    ) -> None:
        if repeats < 1 or concurrency < 1 or attempts < 1:
            raise ValueError("repeats, concurrency and attempts must be at least 1")
        if on_failure not in ("drop", "partial", "rerun"):
            raise ValueError(f"on_failure must be 'drop', 'partial' or 'rerun', not {on_failure!r}")
        if max_reruns < 0 or max_stale_reruns < 0:
            raise ValueError("max_reruns and max_stale_reruns must be >= 0")
        if max_pause <= 0 or (consumer_timeout is not None and consumer_timeout <= 0):
            raise ValueError("max_pause and consumer_timeout must be positive")
        self.client = client
        # None: the client's switch (``RolloutClient.mask_exploits``), off for other clients.
        self.mask_exploits = (
            bool(getattr(client, "mask_exploits", False)) if mask_exploits is None
            else mask_exploits
        )  # fmt: skip
        self.repeats = repeats
        self.concurrency = concurrency
        default_ahead = max(1, 2 * concurrency // repeats)
        self.max_ahead = max_ahead if max_ahead is not None else default_ahead
        if self.max_ahead < 1:
            raise ValueError("max_ahead must be at least 1")
        self.on_failure: OnFailure = on_failure
        self.max_reruns = max_reruns
        self.max_staleness = max_staleness
        self.rerun_stale = rerun_stale
        self.max_stale_reruns = max_stale_reruns
        self.control = control
        self._version = version if version is not None else (control.version if control else 0)
        self.max_pause = max_pause
        self.consumer_timeout = consumer_timeout
        self.policy = RolloutPolicy(rollout_timeout + max_pause, attempts)
        self.budget = budget
        self.stats = StreamStats()
        self.ledger = StreamLedger(Path(output)) if output is not None else None
        self._make_dispatcher = dispatcher or partial(
            LocalDispatcher, dialects=Dialects(ROW_DIALECTS)
        )
        self.judge = (
            StalenessJudge(max_staleness, lambda: self._version)
            if max_staleness is not None
            else None
        )
        self.arrived = asyncio.Event()
        self._feed = GroupFeed(self, rows)
        self._recorder: Recorder | None = None
        self._dispatcher: FeedDispatcher | None = None
        self._task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._error: RollgymError | None = None
        self._paused_until: float | None = None
        self._pause_timeout = 0.0
        self._last_take = time.monotonic()
        self._closing = False  # aclose began: nothing new starts
        self._closed = False  # aclose ended: nothing of the stream runs
        self._entered = False

    # -- state ----------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The live policy version: staleness is judged against it."""
        return self._version

    @property
    def paused(self) -> bool:
        return self._paused_until is not None

    @property
    def closed(self) -> bool:
        """Closed: nothing of the stream runs, its model servers are released and its run
        directory says how it ended (by ``aclose``, the end of its ``async with`` block, or the
        end of a loop over it without one)."""
        return self._closed

    @property
    def ready(self) -> int:
        """Finished groups waiting for the consumer."""
        return len(self._feed.ready)

    @property
    def in_flight(self) -> int:
        """Rollouts dispatched and not yet recorded."""
        return self.stats.dispatched - self.stats.recorded

    def written(self, group: OpenGroup) -> None:
        """A group leaves the stream (to the consumer, or dropped): its records, and those
        its re-runs replaced, go to the run directory now, judged for good."""
        if self.ledger is None:
            return
        for record in (*group.replaced, *group.settled.values()):
            self.ledger.add(record)

    def accepting(self) -> bool:
        return not self._closing and self._error is None

    def item(self, row: dict[str, Any], task_index: int, rollout_index: int) -> RolloutItem:
        stamped = orjson.dumps({**row, "task_index": task_index, "rollout_index": rollout_index})
        return RolloutItem(task_index, rollout_index, stamped, self.client.target.name)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the agent answers, and start dispatching (``async with`` and the first
        ``__anext__`` call it)."""
        if self._task is not None:
            return
        client = self.client
        http = client.http()
        name = client.target.name
        await check_reachable(http, {name: list(client.target.urls)})
        # Once, before the first rollout: which environment scores them, asked of every agent
        # replica (each answers its resources server's, asked of each of its replicas).
        # Replicas that differ stop the stream here: a trainer fed days of rewards from two
        # verifiers, every line stamped with one, would learn from a silent mix.
        said, warnings = await ask_replicas(http, name, client.target.urls, AGENT_ASK_TIMEOUT)
        refuse_mixed(name, said)
        for warning in warnings:
            log.warning("%s", warning)
        budget = None
        if self.budget is not None:
            budget = FailureBudget(self.budget.for_concurrency(self.concurrency))
        self._recorder = recorder = Recorder(
            self._feed, budget, admit=self.judge, mask_exploits=self.mask_exploits
        )
        dispatcher = self._make_dispatcher(self.policy, self.concurrency)
        self._dispatcher = dispatcher
        recorder.on_abort(dispatcher.cancel)
        recorder.on_abort(self._feed.stop)
        if self.ledger is not None:
            self.ledger.open()
            self.ledger.scored_by(name, said)
            if said.get("id") is None:
                log.warning(
                    "agent %s: %s: which environment scored the stream's rollouts is not "
                    "recorded (its lines carry no rollgym_fingerprint)", name, said.get("unknown"),
                )  # fmt: skip
        await dispatcher.start(http, {name: client.target})
        self._task = asyncio.create_task(self._dispatch(dispatcher, recorder))
        self._watchdog = asyncio.create_task(self._watch())

    async def _dispatch(self, dispatcher: FeedDispatcher, recorder: Recorder) -> None:
        try:
            await dispatcher.dispatch(self._feed, self.concurrency, recorder)
        finally:
            self._feed.stop()
            self.arrived.set()

    def fail(self, reason: str, error: RollgymError | None = None) -> None:
        """End the stream: rollouts in flight are cancelled (they stay unrecorded)."""
        if self._error is None:
            self._error = error
        if self._recorder is not None:
            self._recorder.abort(reason)
        else:
            self._feed.stop()

    async def _watch(self) -> None:
        """The pause and consumer deadlines (a watchdog: nobody else may be awake to see
        them run out)."""
        while not self._feed.stopped:
            await asyncio.sleep(WATCH_TICK)
            now = time.monotonic()
            if self._paused_until is not None and now > self._paused_until:
                err = PausedTooLong(
                    f"the stream stayed paused past its deadline ({self._pause_timeout:g}s) "
                    "without a resume",
                    server="collector",
                )
                self.fail(err.message, err)
            waiting = bool(self._feed.ready) and not self._feed.may_grow()
            if (
                self.consumer_timeout is not None
                and waiting
                and now - self._last_take > self.consumer_timeout
            ):
                self.fail(
                    f"the consumer took no group for {self.consumer_timeout:g}s while "
                    f"{len(self._feed.ready)} waited (consumer_timeout)"
                )

    async def aclose(self) -> None:
        """Stop: cancel what is in flight (unrecorded), release the model servers (a pause
        this stream holds, the staleness bound it set), close the run directory."""
        if self._closing:
            return
        self._closing = True
        try:
            await self._shut()
        finally:
            # Only now: ``closed`` promises that nothing of the stream runs any more.
            self._closed = True

    async def _shut(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        self._feed.stop()
        for task in (self._task, self._watchdog):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._dispatcher is not None:
            await self._dispatcher.close()
        if self.control is not None:
            # Closed while paused (a training step that raised), or with the staleness bound
            # this stream set: the model servers serve others after us, so release them.
            if self.paused or self.control.paused or self.max_staleness is not None:
                try:
                    await self.control.release(clear_staleness=self.max_staleness is not None)
                except Exception as exc:  # best effort: each server's failure is logged
                    log.error("releasing the model servers at close failed: %r", exc)
            self._release()
            await self.control.aclose()
        self._close_ledger()

    def _close_ledger(self) -> None:
        if self.ledger is None:
            return
        ledger, self.ledger = self.ledger, None
        reason = self._recorder.abort_reason if self._recorder is not None else None
        completed = (
            self._feed.exhausted and ledger.records == self.stats.dispatched and reason is None
        )
        status = "completed" if completed else ("aborted" if reason else "closed")
        counts = {**asdict(self.stats), "unfinished": self.stats.dispatched - ledger.records}
        ledger.close(status, counts, reason)

    async def __aenter__(self) -> RolloutStream:
        self._entered = True
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- iteration ------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[TaskGroup]:
        # Inside ``async with`` the context owns the stream: a loop may ``break`` (a step's
        # worth of groups) and another loop go on. Used bare, the loop owns it: an async
        # generator, which asyncio closes when the loop leaves it (``break``, an exception),
        # and closing it closes the stream (no dispatcher, watchdog or HTTP session left).
        if self._entered or self._closing:
            return self
        return self._owned()

    async def _owned(self) -> AsyncIterator[TaskGroup]:
        try:
            while True:
                try:
                    group = await self.__anext__()
                except StopAsyncIteration:
                    return
                yield group
        finally:
            await self.aclose()

    async def __anext__(self) -> TaskGroup:
        if self._closing:
            self._raise_if_ended()
            raise StopAsyncIteration
        await self.start()
        while True:
            self.arrived.clear()
            if self._feed.ready:
                group = self._feed.ready.popleft()
                self._feed.wake()  # back-pressure eased: a new row may start
                if self._feed.rejudge(group):
                    continue
                self._last_take = time.monotonic()
                self.stats.groups_yielded += 1
                self.written(group)
                return group.build()
            if self._task is not None and self._task.done():
                # Ended (its rows all done, or it failed). Inside ``async with`` the context
                # releases it (the trainer may still pause for a last weight swap); otherwise
                # it is released now, so a consumer that never calls ``aclose`` leaves nothing
                # running.
                try:
                    self._raise_if_ended()
                finally:
                    if not self._entered:
                        await self.aclose()
                raise StopAsyncIteration
            await self.arrived.wait()

    def _raise_if_ended(self) -> None:
        task = self._task
        ended = task is not None and task.done() and not task.cancelled()
        if ended and task is not None and (exc := task.exception()) is not None:
            raise exc
        self._close_ledger()
        if self._error is not None:
            raise self._error
        recorder = self._recorder
        if recorder is None or recorder.abort_reason is None:
            return
        if self._feed.source_error is not None:
            raise RunAborted(f"stream aborted: {recorder.abort_reason}", server="collector") from (
                self._feed.source_error
            )
        summary = recorder.budget.summary.to_dict() if recorder.budget is not None else {}
        raise RunAborted(
            f"stream aborted: {recorder.abort_reason}",
            server=self.client.target.name,
            body=orjson.dumps(summary),
        )

    # -- weight updates -------------------------------------------------------------------------

    async def pause(
        self, *, abort: bool = False, timeout_s: float | None = None
    ) -> list[PauseAnswer]:
        """Hold new rollouts and (with ``control``) every model call; ``abort``: abort the
        model calls in flight too (re-issued after the resume). The pause ends the stream with
        ``PausedTooLong`` if no ``resume`` comes within ``timeout_s`` (default ``max_pause``)."""
        self._check_open("pause")
        timeout = self.max_pause if timeout_s is None else timeout_s
        if timeout <= 0 or timeout > self.max_pause:
            raise ValueError(f"timeout_s must be in (0, max_pause={self.max_pause:g}]")
        if self._recorder is not None:
            self._recorder.pause(True)
        self._paused_until = time.monotonic() + timeout
        self._pause_timeout = timeout
        if self.control is None:
            return []
        try:
            return await self.control.pause(abort=abort, timeout_s=timeout)
        except BaseException:
            self._release()
            raise

    async def resume(self, version: int) -> None:
        """``version`` is live: staleness is judged against it from now on; release the held
        rollouts and model calls. A model server that refuses raises its typed error (the
        stream stays paused; its deadline still runs)."""
        self._check_open("resume")
        if version < self._version:
            raise ValueError(f"policy versions never go back ({version} < {self._version})")
        if self.control is not None:
            try:
                await self.control.resume(version, max_staleness=self.max_staleness)
            finally:
                self._version = max(self._version, self.control.version)
        self._version = version
        self._release()

    def _check_open(self, what: str) -> None:
        if self._closing:
            # Its control is closed and its model servers released: a pause now would hold
            # them with nothing left to resume it.
            raise RuntimeError(
                f"cannot {what} a closed stream (closed by aclose, its async with block, or the "
                "end of a loop over it without async with); use PolicyControl directly"
            )

    def _release(self) -> None:
        self._paused_until = None
        if self._recorder is not None:
            self._recorder.pause(False)


__all__ = ["DispatcherFactory", "OnFailure", "RolloutStream", "StreamStats"]
