"""The replicas of one server: which one takes the next call, and which one a key sticks to.

The one implementation of replica choice, used by every caller with several URLs for a server:
``HttpClient`` for a ``Target`` with several URLs (agent replicas, model servers, environments),
and ``rollgym.models.replicas.Replicas`` for a proxy's upstream replicas, which adds failover
between them after each replica's own retries. Both keep a circuit breaker per replica and pass
the breakers here; each breaker answers whether it admits a call (``CircuitBreaker.admits``).
The rules:

- **least outstanding**: a new call goes to a ready replica with the fewest calls in flight;
  ties take turns, so that calls made one at a time spread too;
- **gates**: a replica is ready when its breaker is closed and it is not marked down (nothing
  listens there: ``mark_down``; it takes no new calls for a while); a replica whose breaker is
  due a probe, with no call in flight, comes first (the call is the probe); one whose breaker is
  open takes no calls;
- **sticky**: a key (a rollout) goes back to its replica (``stick``, ``home``) while that one is
  ready; otherwise it goes where the rules above send it. The last ``sticky_max`` keys are
  remembered, the least recently used dropped first. When a key sticks is its caller's rule:
  the client at its pick (a session lives where its first call went; a key moved off a replica
  that is down or open sticks where it lands), the proxy once a replica answered (its prefix
  cache holds the turns). A pinned key (``pick(pin=True)``: its state lives on its replica)
  never moves: its caller refuses the call if that replica is down or open;
- with no replica ready, every one, one due a probe first, then least outstanding (the
  caller's breaker refuses them at once: the call fails as ``circuit_open``; or a down replica
  may have come back).

Failover, when a replica failed a call, is one of two rules, by what the call may replay:

- ``fails_over``: a stateless call (a model's chat) goes to another replica after any failure
  that is the server's (5xx, no answer, a garbled answer, its circuit open, its retry budget
  spent), never after a 4xx or a spent deadline;
- ``resends_elsewhere``: a call that is not safe to replay (an agent's ``/run``) goes to
  another replica only when nothing was sent (the connection was refused: the client marked
  the replica down), and only while another replica is live.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from rollgym.errors import (
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    DeadlineExceeded,
    RollgymError,
)
from rollgym.http.breaker import PROBE, READY, SHUT, CircuitBreaker
from rollgym.http.classify import blames_server

Breakers = Sequence[CircuitBreaker | None]
"""A caller's breakers, one per replica in order (``None``: a replica with no breaker yet)."""

STICKY_MAX = 65536
"""Sticky keys remembered (least recently used out first): memory stays flat on long runs."""


def fails_over(err: RollgymError) -> bool:
    """Whether another replica may answer what ``err``'s replica could not."""
    if isinstance(err, CircuitOpen):
        return True  # not sent at all
    if isinstance(err, BudgetExhausted):
        return err.origin is not None and blames_server(err.origin)
    if isinstance(err, DeadlineExceeded):
        return False  # the call's whole time is spent; another replica gets none of it
    # A 4xx is not (the same request would be refused anywhere); 5xx and no answer are.
    return blames_server(err)


def resends_elsewhere(err: RollgymError) -> bool:
    """Whether a call that is not safe to replay may go to another replica after ``err``:
    only when nothing reached the replica (it refused the connection)."""
    return isinstance(err, ConnectError)


class ReplicaSet:
    """Replicas ``urls`` (base URLs), chosen per call by the rules of the module docstring."""

    def __init__(
        self,
        urls: tuple[str, ...],
        *,
        sticky_max: int = STICKY_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("a target needs at least one URL")
        self.urls = urls
        self.outstanding = [0] * len(urls)
        self._index = {url: i for i, url in enumerate(urls)}
        self._homes: OrderedDict[str, int] = OrderedDict()  # sticky key -> replica index
        self._sticky_max = sticky_max
        self._down: dict[int, float] = {}  # index -> when it may be tried again
        self._clock = clock
        self._turn = 0

    # -- choice ------------------------------------------------------------------------------

    def order(self, key: str | None = None, breakers: Breakers | None = None) -> list[int]:
        """The replica indices to try for a call, first choice first: ``key``'s replica while
        it is ready; else one replica due a probe with no call in flight; then the ready ones,
        least outstanding first (ties take turns). ``breakers`` are the caller's, one per
        replica; a replica marked down is shut whatever its breaker says."""
        n = len(self.urls)
        if breakers is None:
            gates = [READY] * n
        else:
            gates = [READY if b is None else b.admits() for b in breakers]
        if self._down:
            gates = [SHUT if self.is_down(i) else g for i, g in enumerate(gates)]
        outstanding = self.outstanding
        turn = self._turn
        self._turn = (turn + 1) % n
        ready = [i for i in range(n) if gates[i] == READY]
        ready.sort(key=lambda i: (outstanding[i], (i - turn) % n))
        home = self._homes.get(key) if key is not None else None
        if key is not None and home is not None and gates[home] == READY:
            self._homes.move_to_end(key)
            return [home, *(i for i in ready if i != home)]
        probes = [i for i in range(n) if gates[i] == PROBE and outstanding[i] == 0]
        chosen = probes[:1] + ready
        if chosen:
            return chosen
        return sorted(range(n), key=lambda i: (gates[i] != PROBE, outstanding[i], i))

    def pick(
        self, sticky: str | None = None, breakers: Breakers | None = None, *, pin: bool = False
    ) -> int:
        """The replica index for the client's next attempt, sticking ``sticky`` to it;
        ``breakers`` as for ``order``. ``pin`` returns the key's replica whatever its state
        (the caller must not fail over: its state is there; it refuses the call itself when
        that replica is down or its circuit open)."""
        if len(self.urls) == 1:
            return 0  # the hot path of a target with one URL: no gate to ask
        if sticky is not None:
            home = self._homes.get(sticky)
            if home is not None and (pin or self._ready(home, breakers)):
                self._homes.move_to_end(sticky)
                return home
        index = self.order(None, breakers)[0]
        if sticky is not None:
            self.stick(sticky, index)  # a key moved off its replica sticks where it lands
        return index

    def _ready(self, index: int, breakers: Breakers | None) -> bool:
        if self.is_down(index):
            return False
        breaker = breakers[index] if breakers is not None else None
        return breaker is None or breaker.admits() == READY

    # -- stickiness --------------------------------------------------------------------------

    def stick(self, key: str, index: int) -> None:
        self._homes[key] = index
        self._homes.move_to_end(key)
        if len(self._homes) > self._sticky_max:
            self._homes.popitem(last=False)

    def home(self, key: str) -> int | None:
        """The replica index ``key`` sticks to, if any (does not refresh the key)."""
        return self._homes.get(key)

    # -- load and liveness -------------------------------------------------------------------

    def begin(self, index: int) -> None:
        self.outstanding[index] += 1

    def end(self, index: int) -> None:
        self.outstanding[index] -= 1

    def index(self, url: str) -> int:
        """The index of base URL ``url``."""
        return self._index[url]

    def mark_down(self, index: int, seconds: float | None = None) -> None:
        """Send no new calls to replica ``index`` (its process or node died); for ``seconds``
        only, if given, after which it is tried again (a restarted replica comes back)."""
        self._down[index] = math.inf if seconds is None else self._clock() + seconds

    def mark_up(self, index: int) -> None:
        self._down.pop(index, None)

    def is_down(self, index: int) -> bool:
        until = self._down.get(index)
        if until is None:
            return False
        if until <= self._clock():
            del self._down[index]
            return False
        return True

    def live(self) -> list[str]:
        """The base URLs not marked down."""
        return [url for i, url in enumerate(self.urls) if not self.is_down(i)]
