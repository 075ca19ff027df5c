"""The rollout core: one rollout through its server's ``/run``, to exactly one record.

Every entry point runs rollouts here and nowhere else: the local collector's workers, the Ray
collect workers and the trainer API. What happens to one rollout:

- it is sent to its agent with the rollout's deadline; the HTTP client retries under the agent's
  own policy (``/run`` is tried once by default: it is not safe to replay);
- refused by an open circuit breaker (here, or in the agent for the model or environment behind
  it), it is held and re-sent after 2, 4 and 6 s, so a short outage does not turn every queued
  task into a failure; nothing reached the server, so no attempt is counted;
- refused by a dead agent replica (nothing sent), it goes to another live replica, once per
  replica, again without counting an attempt;
- refused by every replica (the agent is down), it is recorded as failed without counting an
  attempt: ``--resume`` later still has all of the rollout's attempts;
- a retryable failure is run again while the policy's attempts allow (``retry_in_run``);
- otherwise it ends as a ``FailedRollout`` (with what its attempts spent, where their agent's
  error answers said: ``rollgym.collect.cost.spent_before``; an attempt whose answer said
  nothing flags it ``metered: false``); an answer with a reward ends it as a
  ``ScoredRollout``, its cost carrying its failed attempts' spend (``with_retried``). Only
  cancellation escapes.

How each attempt is sent and its answer read is the item's row dialect's (``collect.dialect``:
the flat row unless the runner was given others): its ``Exchange`` makes the body of attempt N,
reads the answer into the verified record or a typed error, says whether the server's own
retry policy runs the attempts (its ``max_attempts``, its backoff between them) and which fields
a failure's line carries. A failure is also read as any listed dialect's server meant it
(``RowDialect.foreign``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from rollgym import tracing
from rollgym.collect.cost import FAILED, spent_before, summed, with_retried
from rollgym.collect.dialect import Dialects, Exchange
from rollgym.collect.records import FailedRollout, RolloutItem, RolloutRecord, ScoredRollout
from rollgym.config import CollectConfig
from rollgym.errors import ConnectError, InternalError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.http.policy import backoff
from rollgym.http.replicas import resends_elsewhere
from rollgym.tracing.names import (
    ATTEMPT,
    CIRCUIT_HOLD_SPAN,
    DELAY,
    ERROR_SERVER,
    ROLLOUT_RETRY_SPAN,
)
from rollgym.wire import HEADER_ROLLOUT

log = logging.getLogger("rollgym.collect")

CIRCUIT_WAITS = (2.0, 4.0, 6.0)
"""Seconds a rollout refused by an open circuit waits before each re-send: past a 5 s breaker
cool-down, so the breaker's probe has been made by the last one."""


HOLD_TICK = 1.0
"""Seconds between the reports of a rollout still held by an open circuit."""


@dataclass(frozen=True, slots=True)
class RolloutPolicy:
    """How one rollout is run: its deadline, its attempts, how long a circuit holds it."""

    timeout: float = 600.0
    max_attempts: int = 1
    """Total attempts, counted from the item's ``prior_attempts``; retryable failures only."""
    circuit_waits: tuple[float, ...] = CIRCUIT_WAITS

    @classmethod
    def from_collect(cls, cfg: CollectConfig) -> RolloutPolicy:
        # Without retry_in_run a failure is recorded at once and retried by --resume.
        return cls(cfg.rollout_timeout, cfg.max_rollout_attempts if cfg.retry_in_run else 1)


def _never() -> bool:
    return False


@dataclass(slots=True)
class RolloutRunner:
    """Runs rollouts against ``agents`` (name -> target) through ``http``. ``stopping()`` says
    the run is being aborted: no more holds or re-runs, the record is made at once;
    ``on_hold(err)`` hears of every rollout held by an open circuit (the run's failure budget
    watches). ``dialects``: the row dialects its items may be of (the flat row only, by
    default). ``circuit_holds`` and ``failovers`` count what it did; ``in_flight`` is the
    rollouts it is running now (``/metrics``, the live progress)."""

    http: HttpClient
    agents: dict[str, Target]
    policy: RolloutPolicy
    stopping: Callable[[], bool] = field(default=_never, kw_only=True)
    on_hold: Callable[[RollgymError], None] | None = field(default=None, kw_only=True)
    dialects: Dialects = field(default_factory=Dialects, kw_only=True)
    circuit_holds: int = field(default=0, init=False)
    failovers: int = field(default=0, init=False)
    in_flight: int = field(default=0, init=False)

    def run(self, item: RolloutItem) -> Coroutine[Any, Any, RolloutRecord]:
        """Run ``item`` to its record; never raises but ``CancelledError``."""
        # Not ``async`` itself: untraced, the rollout is one coroutine (``_run``), not a wrapper
        # around a second; a collector holds thousands of these in flight, each with its frames.
        # Traced (rollgym.tracing), it runs inside the root span of its own trace.
        running = self._run(item)
        return running if tracing.active is None else tracing.active.rollout(running, item)

    async def _run(self, item: RolloutItem) -> RolloutRecord:
        started = time.monotonic()
        exchange: Exchange | None = None
        self.in_flight += 1
        try:
            target = self.agents[item.agent]
            exchange = self.dialects.named(item.dialect).exchange(item)
            key = item.key
            headers = {HEADER_ROLLOUT: key}
            waits = iter(self.policy.circuit_waits)
            failovers = len(target.urls) - 1  # each replica may refuse once
            attempts = item.prior_attempts
            spent: dict[str, Any] | None = None  # what its failed attempts spent
            max_attempts = self.policy.max_attempts
            if exchange.server_retries:
                max_attempts = max(max_attempts, target.policy.max_attempts)
            while True:
                attempts += 1
                answer = None
                try:
                    answer = await self.http.call(
                        target, "/run", exchange.request(attempts), headers=headers,
                        deadline=self.policy.timeout, sticky=key,
                    )  # fmt: skip
                    verified = exchange.read(answer, attempts, target.name)
                except RollgymError as caught:
                    err, cost = spent_before(self.dialects.foreign(caught, answer, target.name))
                    spent = summed(spent, cost)
                    if self.stopping():
                        return self._failed(item, err, attempts, started, exchange, spent)
                    if (
                        err.root().type == "circuit_open"
                        and (wait := next(waits, None)) is not None
                    ):
                        attempts -= 1  # refused unsent: not an attempt
                        self.circuit_holds += 1
                        await self._hold(err, wait)
                        continue
                    if resends_elsewhere(err) and failovers > 0 and self.http.live_urls(target):
                        # That replica is gone (the client took it out of rotation); another
                        # one gets the rollout. Nothing was sent, so it is not an attempt.
                        failovers -= 1
                        attempts -= 1
                        self.failovers += 1
                        continue
                    if isinstance(err, ConnectError):
                        # Nothing reached the agent: recorded (the run must see a dead agent),
                        # but not as an attempt, so a later --resume still has all of its
                        # attempts.
                        return self._failed(item, err, attempts - 1, started, exchange, spent)
                    if cost is None:  # it reached the agent, which said nothing of its spend
                        spent = summed(spent, FAILED)
                    if err.retryable and attempts < max_attempts:
                        if exchange.server_retries:
                            delay = backoff(target.policy, attempts)
                            with tracing.span(
                                ROLLOUT_RETRY_SPAN, {DELAY: delay, ATTEMPT: attempts}
                            ):
                                await asyncio.sleep(delay)
                        continue
                    return self._failed(item, err, attempts, started, exchange, spent)
                if spent is not None:  # its failed attempts' spend is waste: carried, not lost
                    with_retried(verified, spent, attempts - item.prior_attempts - 1)
                return ScoredRollout(
                    item.task_index, item.rollout_index, float(verified["reward"]), attempts,
                    time.monotonic() - started, verified,
                )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must still end as this rollout's record
            log.exception("unexpected error in rollout %s", item.key)
            bug = InternalError(f"collector: {type(exc).__name__}: {exc}", server="collector")
            return self._failed(item, bug, item.prior_attempts + 1, started, exchange)
        finally:
            self.in_flight -= 1

    async def _hold(self, err: RollgymError, seconds: float) -> None:
        """Wait ``seconds`` before re-sending a rollout refused by an open circuit, telling
        ``on_hold`` every second that it is still held: the run's budget must see a circuit
        that stays open as it happens, not only when a held rollout is re-sent."""
        end = time.monotonic() + seconds
        with tracing.span(CIRCUIT_HOLD_SPAN, {DELAY: seconds, ERROR_SERVER: err.server or ""}):
            while (left := end - time.monotonic()) > 0:
                if self.on_hold is not None:
                    self.on_hold(err)
                    if self.stopping():
                        # The hold ended the run: like every rollout in flight at an abort, this
                        # one stays unrecorded (``--resume`` runs it).
                        raise asyncio.CancelledError
                await asyncio.sleep(min(HOLD_TICK, left))

    @staticmethod
    def _failed(
        item: RolloutItem,
        err: RollgymError,
        attempts: int,
        started: float,
        exchange: Exchange | None,
        spent: dict[str, Any] | None = None,
    ) -> FailedRollout:
        fields = None if exchange is None else exchange.fields(err)
        took = time.monotonic() - started
        return FailedRollout(
            item.task_index, item.rollout_index, err, attempts, took, fields, spent
        )
