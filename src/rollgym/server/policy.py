"""The policy gate of a model server: which weights are live, pauses for weight updates, and
the staleness bound of asynchronous training. One per model server (``ModelServer.policy``),
used by every model call it serves; its endpoints are declared once (``policy_routes``).

Every model call runs through ``PolicyGate.run``. Its outcomes:

- **admitted**: not paused, not stale: the call runs now, under the live ``version``;
- **held**: while paused (``/rollgym/pause``), a new call waits until ``/rollgym/resume`` (not
  refused: it just takes longer), then runs under the resumed version;
- **aborted and re-issued**: a pause with ``abort`` cancels the calls running upstream (their
  HTTP requests are closed: vLLM aborts a request whose client disconnects); each is held like
  a new call and re-issued after the resume from the same request, its aborted versions
  recorded (``Ran.aborted_versions``). The caller never sees the abort;
- **stale** (``StaleRollout``, 409): with ``max_staleness = k``, a call whose rollout's oldest
  earlier call (``x-rollgym-oldest-version``) is more than ``k`` versions behind the live one,
  checked when it is admitted, a re-issue after an abort included;
- **paused too long** (``PausedTooLong``, 504, final): a pause no resume ended within its
  ``timeout_s``: the held calls fail, and the gate unpauses itself (logged), so a trainer that
  died while paused does not stop the model server for good.

The gate counts what runs upstream (``in_flight``) and what waits (``held``); a pause answers
once nothing runs upstream, or at its deadline. Every wait here is bounded by the pause's
deadline. Environment (resources) calls never pass through a gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rollgym.errors import InvalidRequest, PausedTooLong, StaleRollout
from rollgym.wire import HEADER_OLDEST_VERSION

log = logging.getLogger("rollgym.server.policy")

T = TypeVar("T")

MAX_PAUSE_S = 3600.0
"""The longest pause one ``/rollgym/pause`` may ask for (it may be extended by another)."""
DEFAULT_PAUSE_S = 300.0
"""A pause's deadline when the request names none."""
_MAX_VERSION_DIGITS = 18
"""An ``x-rollgym-oldest-version`` longer than this is no version (and no 64-bit integer)."""


@dataclass(eq=False)
class Flight:
    """One model call running upstream under ``version``. The work may note which replica
    answered and the version the upstream itself reports (``note_upstream``)."""

    version: int
    replica: int | None
    upstream_version: int | None = None
    task: asyncio.Task[Any] | None = None
    aborted: bool = False


# The flight of the call running in this task (the work's task inherits it from ``run``).
_FLIGHT: ContextVar[Flight | None] = ContextVar("rollgym_policy_flight", default=None)


def note_upstream(replica: int | None = None, version: Any = None) -> None:
    """Note, for the model call running in this task, the replica that answered it and the
    policy version the upstream reports (ignored unless a non-negative integer). A no-op
    outside a gate."""
    flight = _FLIGHT.get()
    if flight is None:
        return
    if replica is not None:
        flight.replica = replica
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
        flight.upstream_version = version


@dataclass(frozen=True)
class Ran(Generic[T]):
    """A model call's result and what it ran under."""

    value: T
    version: int
    """The upstream's own version if it reported one, else the gate's live version when the
    call (its last issue) started."""
    replica: int | None
    aborted_versions: tuple[int, ...] = ()
    """The versions under which earlier issues of this call were aborted by a pause."""


@dataclass(eq=False)
class _Pause:
    deadline: float
    released: asyncio.Event = field(default_factory=asyncio.Event)
    expired: bool = False
    timer: asyncio.TimerHandle | None = None


def oldest_version(headers: Mapping[str, str]) -> int | None:
    """The ``x-rollgym-oldest-version`` of a call (None: absent, the rollout's first call);
    anything but a non-negative integer is the caller's mistake (400), never a 500."""
    raw = headers.get(HEADER_OLDEST_VERSION)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or not text.isascii() or len(text) > _MAX_VERSION_DIGITS:
        raise InvalidRequest(
            f"header {HEADER_OLDEST_VERSION} must be a non-negative integer (a policy "
            f"version), not {raw[:40]!r}",
            status=400,
        )
    return int(text)


class PolicyGate:
    """Version, pause, held and in-flight calls, and the staleness check of one model server
    (see the module docstring). ``default_replica``: the replica a call is recorded as answered
    by unless its work notes another (0 for a server that is its own upstream)."""

    def __init__(
        self,
        server: str,
        *,
        version: int = 0,
        default_replica: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.version = version
        self.max_staleness: int | None = None
        self.default_replica = default_replica
        self._clock = clock
        self._pause: _Pause | None = None
        self._flights: set[Flight] = set()
        self._held = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def paused(self) -> bool:
        return self._pause is not None

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    @property
    def held(self) -> int:
        return self._held

    def state(self) -> dict[str, Any]:
        """``GET /rollgym/policy``'s answer."""
        return {
            "version": self.version,
            "paused": self.paused,
            "max_staleness": self.max_staleness,
            "in_flight": self.in_flight,
            "held": self.held,
        }

    def raise_version(self, version: int) -> None:
        """The live version is at least ``version`` (the server loaded those weights itself,
        e.g. a CPU backend's weight push); never lowers it."""
        self.version = max(self.version, version)

    # -- one model call ---------------------------------------------------------------------------

    async def run(self, oldest: int | None, work: Callable[[], Awaitable[T]]) -> Ran[T]:
        """``work()`` as one model call of a rollout whose oldest earlier call ran under
        ``oldest`` (None: none, or unknown): held while paused, re-issued when a pause aborts
        it, refused when stale (module docstring)."""
        aborted: list[int] = []
        while True:
            await self._admit(oldest)
            flight = Flight(self.version, self.default_replica)
            token = _FLIGHT.set(flight)
            try:
                # A task of its own, so that a pause can cancel it without cancelling us.
                task: asyncio.Task[T] = asyncio.ensure_future(work())
            finally:
                _FLIGHT.reset(token)
            flight.task = task
            self._flights.add(flight)
            self._idle.clear()
            try:
                value = await task
            except BaseException:
                me = asyncio.current_task()
                if flight.aborted and (me is None or me.cancelling() == 0):
                    # Aborted by a pause (whatever the cancelled work raised), and our caller
                    # still waits: hold it and issue it again from the same request.
                    aborted.append(flight.version)
                    continue
                raise
            finally:
                self._flights.discard(flight)
                if not self._flights:
                    self._idle.set()
            version = flight.version if flight.upstream_version is None else flight.upstream_version
            return Ran(value, version, flight.replica, tuple(aborted))

    async def _admit(self, oldest: int | None) -> None:
        while (pause := self._pause) is not None:
            self._held += 1
            try:
                # Bounded by the pause's deadline (extended if the pause is); the timer set by
                # ``pause`` expires it, and so does the first waiter to see the deadline pass.
                while not pause.released.is_set():
                    left = pause.deadline - self._clock()
                    if left <= 0:
                        self._expire(pause)
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(pause.released.wait(), left)
            finally:
                self._held -= 1
            if pause.expired:
                raise PausedTooLong(
                    f"model calls were paused for a weight update and no /rollgym/resume came "
                    f"within the pause's timeout_s; {self.server} unpaused itself",
                    server=self.server, retryable=False,
                )  # fmt: skip
        self._check_stale(oldest)

    def _check_stale(self, oldest: int | None) -> None:
        bound = self.max_staleness
        if bound is None or oldest is None or self.version - oldest <= bound:
            return
        raise StaleRollout(
            f"the rollout's oldest model call ran under policy version {oldest}, "
            f"{self.version - oldest} versions behind the live version {self.version} "
            f"(max_staleness {bound})",
            status=409, server=self.server, retryable=False,
        )  # fmt: skip

    # -- the trainer's side -----------------------------------------------------------------------

    async def pause(self, *, abort: bool, timeout_s: float) -> dict[str, Any]:
        """Hold new calls for at most ``timeout_s`` seconds from now (a pause while paused
        moves its deadline); with ``abort``, cancel the calls running upstream (they are held
        and re-issued after the resume). Answers once nothing runs upstream, or at the deadline."""
        deadline = self._clock() + timeout_s
        pause = self._pause
        created = pause is None
        if pause is None:
            pause = self._pause = _Pause(deadline)
        else:
            pause.deadline = deadline
        if pause.timer is not None:
            pause.timer.cancel()
        pause.timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, pause)
        aborted = 0
        if abort:
            for flight in list(self._flights):
                if not flight.aborted and flight.task is not None and flight.task.cancel():
                    flight.aborted = True
                    aborted += 1
        try:
            while self._flights and self._pause is pause:
                left = pause.deadline - self._clock()
                if left <= 0:
                    break
                try:
                    await asyncio.wait_for(self._idle.wait(), left)
                except TimeoutError:
                    break
        except asyncio.CancelledError:
            # The trainer's request went away before the answer (its deadline, its process):
            # it never learnt it paused us, so nobody will resume. A pause this call made is
            # undone (no weights changed: held calls go on under the live version).
            if created and self._pause is pause:
                log.warning(
                    "%s: the /rollgym/pause request was dropped before its answer; unpausing",
                    self.server,
                )
                self._unpause(pause)
            raise
        # Let the aborted calls reach their hold: each does so without awaiting once its work
        # has finished, which ``_idle`` says it has.
        await asyncio.sleep(0)
        return {
            "version": self.version,
            "paused": self.paused,
            "aborted": aborted,
            "held": self.held,
            "in_flight": self.in_flight,
        }

    def resume(
        self, version: int, max_staleness: int | None, *, set_staleness: bool
    ) -> dict[str, Any]:
        """Make ``version`` live (never lower: 409), set the staleness bound (if
        ``set_staleness``) and release the held calls."""
        if version < self.version:
            raise InvalidRequest(
                f"version {version} is below the live policy version {self.version}: versions "
                "never go back (a stale trainer process?)",
                status=409, server=self.server,
            )  # fmt: skip
        self.version = version
        if set_staleness:
            self.max_staleness = max_staleness
        released = self.held
        if self._pause is not None:
            self._unpause(self._pause)
        return {
            "version": self.version,
            "paused": False,
            "max_staleness": self.max_staleness,
            "released": released,
        }

    def _unpause(self, pause: _Pause) -> None:
        self._pause = None
        if pause.timer is not None:
            pause.timer.cancel()
        pause.released.set()

    def _expire(self, pause: _Pause) -> None:
        if self._pause is not pause or pause.released.is_set():
            return
        log.warning(
            "%s: paused for a weight update, but no /rollgym/resume came before the pause's "
            "deadline; unpausing (version %d), %d held model calls fail as paused_too_long",
            self.server, self.version, self._held,
        )  # fmt: skip
        if pause.timer is not None:
            pause.timer.cancel()
        pause.expired = True
        self._pause = None
        pause.released.set()
