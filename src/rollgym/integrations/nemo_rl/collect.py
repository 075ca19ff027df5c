"""``run_examples``'s batch: NeMo RL's rows through rollgym's rollout core, as awaitables.

``run_examples`` returns an iterator of awaitables, as NeMo Gym 0.7's does; the k-th resolves to the
k-th rollout to finish, as ``(row, result)``. Rows start in the order given, once the iterator is
first consumed. Here each row is one rollout through the trainer API's machinery: the rollout core
(``RolloutRunner``: the agent's own retry policy, the rollout's deadline, circuit holds, replica
failover) under a ``LocalDispatcher`` (bounded, ramped concurrency) and a ``Recorder`` with the
batch's failure budget. A batch whose failures cross the budget (the servers are broken) is
cancelled: every awaitable not yet resolved raises ``RunAborted`` with the failure summary.
Otherwise no rollout raises: a failed one resolves to a masked result (see ``results``), unless the
helper was made with ``on_failure="raise"``.

Its keyword arguments, as honoured here:

- ``semaphore``: held around each rollout;
- ``route_failures_to_sidecar``: a failure never raises (its result is the masked one, which
  carries the ``_ng_failure_*`` fields), even with ``on_failure="raise"``;
- ``environment_server_name``: the rollgym agent that runs every row (rollgym's agents serve
  the episodes environment servers do);
- ``max_resident_tasks``: the most rollouts in flight (else the config's
  ``collect.concurrency`` if it sets one, else every row at once);
- ``dispatch_budget_s`` / ``drain_margin_s``: a row not started within the budget (or with less
  than the margin left; without a margin, the p75 of the batch's rollouts once 5 finished)
  resolves to a masked ``not_dispatched`` result with the ``cancelled`` markers, and counts
  toward no failure budget;
- ``latency_tracker``: a ``DispatchLatencyTracker`` (anything with ``record``,
  ``record_drained`` and ``drain_margin``) is told each rollout's seconds and each drained row,
  and asked for the margin.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
import warnings
import weakref
from collections.abc import Awaitable, Iterator
from typing import Any, Literal, Protocol

import orjson

from rollgym.audit.scan import FIELD as INTEGRITY
from rollgym.collect.dialect import Dialects
from rollgym.collect.dispatch import LocalDispatcher, Runner
from rollgym.collect.failure_budget import BudgetRules, FailureBudget
from rollgym.collect.recorder import Recorder
from rollgym.collect.records import FailedRollout, RolloutItem, RolloutRecord, checked, tagged
from rollgym.collect.rollout import RolloutPolicy, RolloutRunner
from rollgym.collect.route import AgentRoute
from rollgym.config import Config
from rollgym.dialects import ROW_DIALECTS
from rollgym.errors import ConfigError, RollgymError, RunAborted, WaitedTooLong
from rollgym.http import HttpClient, Target
from rollgym.integrations.nemo_rl.plan import RollgymCompatWarning
from rollgym.integrations.nemo_rl.results import failed_result, has_token_data, scored_result
from rollgym.integrations.nemo_rl.stack import Layout
from rollgym.models.tokens import tokenize_request
from rollgym.models.translate import responses_to_chat
from rollgym.wire import MASK_REASON, MASK_SAMPLE

OnFailure = Literal["mask", "raise"]
STAMPED = ("task_index", "rollout_index")
"""What rollgym stamps on a row to route it; removed from results again."""
TOKENIZE_DEADLINE = 15.0
"""Seconds to tokenize a failed row's prompt before the placeholder is used instead."""


class LatencyTracker(Protocol):
    def record(self, seconds: float) -> None: ...
    def record_drained(self) -> None: ...
    def drain_margin(self, configured: float | None) -> float | None: ...


class BatchTracker:
    """The drain margin: an explicit one, else the p75 of the rollouts finished (from 5 on)."""

    def __init__(self) -> None:
        self._durations: list[float] = []
        self.drained = 0

    def record(self, seconds: float) -> None:
        if seconds > 0:
            bisect.insort(self._durations, seconds)

    def record_drained(self) -> None:
        self.drained += 1

    def drain_margin(self, configured: float | None) -> float | None:
        if configured is not None:
            return configured
        if len(self._durations) < 5:
            return None
        pos = (len(self._durations) - 1) * 0.75
        low = int(pos)
        high = min(low + 1, len(self._durations) - 1)
        return self._durations[low] * (1 - (pos - low)) + self._durations[high] * (pos - low)


class Batch:
    """One ``run_examples`` call: iterate for the awaitables (see the module docstring)."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        agents: list[str],
        layout: Layout,
        pool: HttpClient | None,
        *,
        semaphore: Any,
        on_failure: OnFailure,
        concurrency: int,
        deadline: float | None,
        drain_margin_s: float | None,
        tracker: LatencyTracker,
        warn_tokens: Any,
    ) -> None:
        self.rows = rows
        self.items = [
            RolloutItem(i, 0, _stamped(row, i), agent)
            for i, (row, agent) in enumerate(zip(rows, agents, strict=True))
        ]
        self.layout = layout
        self.pool = pool
        self.semaphore = semaphore
        self.on_failure = on_failure
        self.concurrency = concurrency
        self.deadline = deadline
        self.drain_margin_s = drain_margin_s
        self.tracker = tracker
        self.warn_tokens = warn_tokens
        self.drained: set[int] = set()
        self._queue: asyncio.Queue[tuple[dict[str, Any], dict[str, Any]] | BaseException] = (
            asyncio.Queue()
        )
        self._delivered: set[int] = set()
        self._handed = 0
        self._driver: asyncio.Task[None] | None = None
        self._tokenizer_down = False
        self.http: HttpClient | None = None

    def __iter__(self) -> Iterator[Awaitable[tuple[dict[str, Any], dict[str, Any]]]]:
        return self

    def __next__(self) -> Awaitable[tuple[dict[str, Any], dict[str, Any]]]:
        if self._handed >= len(self.items):
            raise StopIteration
        if self._driver is None:
            try:
                self._driver = asyncio.get_running_loop().create_task(self._drive())
            except RuntimeError:
                raise RuntimeError(
                    "run_examples' awaitables start their rollouts on the running event loop: "
                    "iterate them inside a coroutine"
                ) from None
        self._handed += 1
        return self._next()

    async def _next(self) -> tuple[dict[str, Any], dict[str, Any]]:
        got = await self._queue.get()
        if isinstance(got, BaseException):
            raise got
        return got

    # -- the dispatch ------------------------------------------------------------------------

    async def _drive(self) -> None:
        own = self.pool is None  # iterated outside the loop the helper was called in
        self.http = http = self.pool or HttpClient()
        try:
            await self._dispatch(http)
        except Exception as exc:  # a bug here must still end every awaitable
            self._fail_rest(exc)
        finally:
            self._fail_rest(RuntimeError("run_examples: the batch ended without this rollout"))
            if own:
                await http.close()

    async def _dispatch(self, http: HttpClient) -> None:
        cfg = self.layout.config.collect
        agents = {name: self.layout.target(name) for name in {i.agent for i in self.items}}
        rules = BudgetRules(
            cfg.max_failures, cfg.max_failure_rate, cfg.min_failure_samples,
            cfg.config_error_window,
        ).for_concurrency(self.concurrency)  # fmt: skip
        recorder = Recorder(_Sink(self), FailureBudget(rules), mask_exploits=cfg.mask_exploits)
        dialects = Dialects(ROW_DIALECTS)

        def runner(
            client: HttpClient, targets: dict[str, Target], policy: RolloutPolicy, stop: Any
        ) -> Runner:
            inner = RolloutRunner(client, targets, policy, stopping=stop, dialects=dialects)
            return _BatchRunner(inner, self, cfg.mask_exploits)

        dispatcher = LocalDispatcher(RolloutPolicy.from_collect(cfg), self.concurrency,
                                     runner=runner)  # fmt: skip
        recorder.on_abort(dispatcher.cancel)
        await dispatcher.start(http, agents)
        try:
            await dispatcher.dispatch(iter(self.items), len(self.items), recorder)
        finally:
            dispatcher.cancel()  # an aborted batch leaves nothing running
        if recorder.abort_reason is not None:
            assert recorder.budget is not None
            summary = orjson.dumps(recorder.budget.summary.to_dict())
            reason = f"batch aborted: {recorder.abort_reason}"
            self._fail_rest(RunAborted(reason, server="collector", body=summary))

    def _fail_rest(self, error: BaseException) -> None:
        for item in self.items:
            if item.task_index not in self._delivered:
                self._delivered.add(item.task_index)
                self._queue.put_nowait(error)

    def deliver(self, index: int, result: dict[str, Any] | BaseException) -> None:
        if index in self._delivered:
            return
        self._delivered.add(index)
        self._queue.put_nowait(result if isinstance(result, BaseException) else
                               (self.rows[index], result))  # fmt: skip

    def drain_reason(self) -> str | None:
        """Why a row that is about to start is not started (the dispatch drain), or None."""
        if self.deadline is None:
            return None
        remaining = self.deadline - time.monotonic()
        margin = self.tracker.drain_margin(self.drain_margin_s)
        if remaining <= 0:
            return "not dispatched: dispatch budget exhausted"
        if margin is not None and remaining < margin:
            return (
                f"not dispatched: {remaining:.0f}s left in dispatch budget, below the "
                f"{margin:.0f}s drain margin"
            )
        return None

    async def result_of(self, record: RolloutRecord, item: RolloutItem) -> dict[str, Any]:
        row = self.rows[item.task_index]
        if record.ok:
            verified = {**record.verified, MASK_SAMPLE: True} if record.masked else record.verified
            result = scored_result(verified, row, STAMPED)
            if record.integrity is not None:
                # Its verdict, as rollouts.jsonl has it; a masked exploit says why it is masked.
                result[INTEGRITY] = record.integrity.to_dict()
                if record.integrity.masked:
                    result.setdefault(MASK_REASON, "exploit")
            if not has_token_data(result):
                self.warn_tokens()
            return result
        prompt = await self.prompt_ids(row)
        return failed_result(row, record.error, record.attempts, prompt, model=self._model_name())

    async def prompt_ids(self, row: dict[str, Any]) -> list[int] | None:
        """The row's prompt as the policy model tokenizes it; None when it cannot (no policy
        model, or it does not answer: then once per batch, not once per failed row)."""
        name = self.layout.policy_model
        http = self.http
        if name is None or http is None or self._tokenizer_down or name not in self.layout.urls:
            return None
        try:
            chat = responses_to_chat(dict(row.get("responses_create_params") or {}))
        except RollgymError:  # the row's own params cannot be rendered: no prompt ids for it
            return None
        try:
            answer = await http.call(
                self.layout.target(name), "/tokenize", tokenize_request(chat),
                deadline=TOKENIZE_DEADLINE,
            )  # fmt: skip
        except RollgymError:
            self._tokenizer_down = True
            return None
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not tokens:
            return None
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return None
        return tokens

    def _model_name(self) -> str | None:
        name = self.layout.policy_model
        options = self.layout.config.servers[name].options if name else {}
        model = options.get("model")
        return model if isinstance(model, str) else None


class _Sink:
    """The batch's sink for the recorder: every record once. A row the dispatch budget drained
    has no outcome: it is kept from the failure budget (``add`` answers False)."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.seen: set[int] = set()

    def add(self, record: RolloutRecord) -> bool:
        if record.task_index in self.seen:
            return False
        self.seen.add(record.task_index)
        return record.task_index not in self.batch.drained


class _BatchRunner:
    """The rollout core for one batch: the semaphore and the drain check around each rollout,
    and its result handed to the batch as soon as it is made."""

    def __init__(self, inner: RolloutRunner, batch: Batch, mask_exploits: bool = False) -> None:
        self.inner = inner
        self.batch = batch
        self.mask_exploits = mask_exploits

    @property
    def on_hold(self) -> Any:
        return self.inner.on_hold

    @on_hold.setter
    def on_hold(self, value: Any) -> None:
        self.inner.on_hold = value

    @property
    def circuit_holds(self) -> int:
        return self.inner.circuit_holds

    @circuit_holds.setter
    def circuit_holds(self, value: int) -> None:
        self.inner.circuit_holds = value

    @property
    def failovers(self) -> int:
        return self.inner.failovers

    @failovers.setter
    def failovers(self, value: int) -> None:
        self.inner.failovers = value

    async def run(self, item: RolloutItem) -> RolloutRecord:
        batch = self.batch
        held = batch.semaphore if batch.semaphore is not None else contextlib.nullcontext()
        async with held:
            reason = batch.drain_reason()
            if reason is not None:
                batch.drained.add(item.task_index)
                batch.tracker.record_drained()
                err = WaitedTooLong(reason, server="collector")
                row = batch.rows[item.task_index]
                batch.deliver(item.task_index, failed_result(row, err, 0, None, drained=True))
                return FailedRollout(item.task_index, item.rollout_index, err, 0, 0.0)
            started = time.monotonic()
            # Its integrity verdict (and mask) before NeMo RL sees it: the result is made here,
            # ahead of the recorder, which leaves a tagged record as it is.
            record = tagged(checked(await self.inner.run(item)), self.mask_exploits)
            if record.ok:
                batch.tracker.record(time.monotonic() - started)
        if not record.ok and batch.on_failure == "raise":
            batch.deliver(item.task_index, record.error)
        else:
            batch.deliver(item.task_index, await batch.result_of(record, item))
        return record


def route_rows(
    rows: list[dict[str, Any]], config: Config, environment_server_name: str | None
) -> list[str]:
    """The agent of each row: ``environment_server_name`` for every row, else the row's
    ``agent_ref.name`` (an agent of the config, or a name ``collect.agent_aliases`` maps),
    else the config's default agent. ``ConfigError`` before anything runs, naming the row."""
    collect = config.collect
    if environment_server_name is not None:
        if environment_server_name not in config.servers or (
            config.servers[environment_server_name].kind != "agent"
        ):
            raise ConfigError(
                f"environment_server_name {environment_server_name!r} is not an agent of the "
                f"rollgym config {config.source or ''}".rstrip()
            )
        route = AgentRoute.of(config, collect, environment_server_name)
        route = AgentRoute(route.agents, environment_server_name, route.aliases, override=True)
    else:
        route = AgentRoute.of(config, collect)
    agents = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError(f"examples[{index}]: a row must be a dict, not {type(row).__name__}")
        ref = row.get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        agent = route.agent_for(name)
        if agent is None:
            why = route.refusal(name) if name is not None else "it names no agent (agent_ref)"
            raise ConfigError(f"examples[{index}]: {why}")
        agents.append(agent)
    return agents


def tracker_of(latency_tracker: Any) -> LatencyTracker:
    if latency_tracker is None:
        return BatchTracker()
    if all(callable(getattr(latency_tracker, m, None)) for m in _TRACKER_METHODS):
        return latency_tracker  # type: ignore[no-any-return]
    warnings.warn(
        f"latency_tracker: {type(latency_tracker).__name__} has no "
        f"{'/'.join(_TRACKER_METHODS)}; rollgym keeps its own",
        RollgymCompatWarning,
        stacklevel=3,
    )
    return BatchTracker()


_TRACKER_METHODS = ("record", "record_drained", "drain_margin")


class Pools:
    """One connection pool per event loop (aiohttp sessions belong to a loop)."""

    def __init__(self) -> None:
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpClient] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, limit: int | None) -> HttpClient | None:
        """The running loop's pool (None outside a loop: the batch makes one when it starts)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = HttpClient(limit=limit or 8192)
        return pool

    async def aclose(self) -> None:
        with contextlib.suppress(RuntimeError):
            pool = self._pools.pop(asyncio.get_running_loop(), None)
            if pool is not None:
                await pool.close()


def _stamped(row: dict[str, Any], index: int) -> bytes:
    try:
        return orjson.dumps({**row, "task_index": index, "rollout_index": 0})
    except TypeError as exc:
        raise TypeError(f"examples[{index}]: not JSON: {exc}") from None
