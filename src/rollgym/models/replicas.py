"""Several upstream replicas behind one ``openai_proxy``: vLLM's data-parallel servers with no
load balancer in front of them (``base_url`` given as a list).

Each replica is its own pair of client ``Target``s (chat at its ``base_url``, ``/tokenize`` at
its root), so the shared ``HttpClient`` keeps a circuit breaker, a retry budget and stats per
replica. ``Replicas`` decides where each call goes, by the client's rules of replica choice
(``rollgym.http.replicas.ReplicaSet``: least outstanding, ties taking turns; sticky keys; a
replica due a probe first), with each replica's breakers as its gates:

- **sticky** (``sticky_replicas``): calls with the same key (the rollout, from the
  ``x-rollgym-rollout`` header) go back to the replica that answered the key's last call, whose
  prefix cache holds the conversation so far; the last ``STICKY_MAX`` keys are remembered;
- **an open breaker** takes no new calls (a sticky key moves, and sticks where it lands: model
  calls are stateless, only the cache is lost); after the breaker's cooldown one call probes it
  (the breaker says when: ``CircuitBreaker.admits``);
- **failover**: a call whose replica failed on the server's side after that replica's own
  retries (5xx, no answer, a garbled answer, its circuit open, its retry budget spent) goes to
  the next replica, each replica at most once, within the call's one deadline. A 4xx is the
  caller's mistake and is raised at once; so is a spent deadline. When every replica failed,
  the last error is raised.

Why a ``Target`` per replica rather than one ``Target`` with every URL (which the client also
serves, with a breaker per URL: an agent's replicas): here a call moves to another replica only
once its replica's own retries are spent, where the client's attempts at one target go wherever
its choice sends each one; a call's ``/tokenize`` must reach the replica that generated it, at
a second target whose choice would be its own; and each replica keeps its own retry budget,
stats and liveness watch. The choice itself is the client's (one ``ReplicaSet``, asking each
replica's breaker), as is the rule of which failures move a call (``fails_over``).

A single replica keeps the names the proxy always had (``NAME.upstream``, ``NAME.upstream_root``)
and is called exactly as before: no failover, no deadline of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rollgym.config import RetryPolicy
from rollgym.errors import DeadlineExceeded, RollgymError
from rollgym.http import Target
from rollgym.http.breaker import CircuitBreaker
from rollgym.http.replicas import STICKY_MAX, ReplicaSet, fails_over

log = logging.getLogger("rollgym.models.replicas")

T = TypeVar("T")


@dataclass(frozen=True)
class Replica:
    """One upstream server: its chat target (``base_url``) and its root (``/tokenize``)."""

    index: int
    chat: Target
    root: Target


def replica_targets(name: str, urls: Sequence[str], policy: RetryPolicy) -> tuple[Replica, ...]:
    """The replicas of proxy ``name`` for ``urls`` (each ending in ``/v1``, or not)."""
    several = len(urls) > 1
    replicas = []
    for i, url in enumerate(urls):
        suffix = f"[{i}]" if several else ""
        chat = Target(f"{name}.upstream{suffix}", (url,), policy)
        root_url = url.removesuffix("/v1")
        # Another name for another URL: the client keeps its breaker and stats per name.
        root = (
            chat
            if root_url == url
            else Target(f"{name}.upstream_root{suffix}", (root_url,), policy)
        )
        replicas.append(Replica(i, chat, root))
    return tuple(replicas)


class Replicas:
    """Chooses a replica per call and fails over to the others (see the module docstring).

    ``breaker`` looks up the client's breaker of a target name (``None``: not called yet).
    """

    def __init__(
        self,
        replicas: Sequence[Replica],
        breaker: Callable[[str], CircuitBreaker | None],
        *,
        sticky: bool = True,
        deadline: float,
        sticky_max: int = STICKY_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise ValueError("at least one replica is needed")
        self.all = tuple(replicas)
        self._breaker = breaker
        self._sticky = sticky
        self._deadline = deadline
        self._clock = clock
        self._set = ReplicaSet(tuple(r.chat.urls[0] for r in self.all), sticky_max=sticky_max)

    def outstanding(self) -> list[int]:
        """Calls in flight per replica, in order."""
        return list(self._set.outstanding)

    def home(self, key: str) -> int | None:
        """The replica index ``key`` sticks to, if any (does not refresh the key)."""
        return self._set.home(key)

    async def run(
        self,
        key: str | None,
        work: Callable[[Replica, float | None], Awaitable[T]],
        *,
        root: bool = False,
    ) -> T:
        """``work(replica, deadline)`` on the chosen replica, failing over to the others.

        ``deadline`` is the seconds left of the call's total (``None`` with one replica: its
        calls keep their own). ``root``: the call starts at the replica's root (``/tokenize``),
        so that target's breaker decides whether the replica takes it.
        """
        if len(self.all) == 1:
            return await self._on(self.all[0], work, None)
        start = self._clock()
        last: RollgymError | None = None
        for replica in self.order(key if self._sticky else None, root=root):
            left = self._deadline - (self._clock() - start)
            if last is not None and left <= 0:
                break
            try:
                result = await self._on(replica, work, left)
            except RollgymError as err:
                if not fails_over(err):
                    if last is not None and isinstance(err, DeadlineExceeded):
                        # The sliver of time left ran out on this replica: the failure worth
                        # reporting is the one that sent the call here.
                        raise last from None
                    raise
                log.info("%s failed (%s); trying another replica", replica.chat.name, err.type)
                last = err
                continue
            if key is not None and self._sticky:
                self._set.stick(key, replica.index)
            return result
        assert last is not None  # the order is never empty
        raise last

    def order(self, key: str | None, *, root: bool = False) -> list[Replica]:
        """The replicas to try for a call, first choice first.

        A sticky key's replica while its breaker is closed; else one replica due a probe (its
        breaker open past the cooldown, no call in flight there); then the closed replicas,
        least outstanding first. With every breaker open: all of them (the client refuses
        each at once, and the call fails as ``circuit_open``).
        """
        # Looked up at each call: the client makes a target's breaker at its first call (and
        # anew when its policy changes).
        breakers = [self._breaker((r.root if root else r.chat).name) for r in self.all]
        return [self.all[i] for i in self._set.order(key, breakers)]

    async def _on(
        self,
        replica: Replica,
        work: Callable[[Replica, float | None], Awaitable[T]],
        left: float | None,
    ) -> T:
        self._set.begin(replica.index)
        try:
            return await work(replica, left)
        finally:
            self._set.end(replica.index)
