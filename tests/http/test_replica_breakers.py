"""A circuit breaker per replica of one target, served for real on 127.0.0.1: a sick replica's
circuit opens for it alone while its target's calls go on to the others; every replica open
fails the call as ``circuit_open``; a sticky key moves off an open replica, a pinned one does
not; a replica due a probe takes one call. No waits on the clock: cool-downs are 60 s (never
reached in a test) or a microsecond (past before the next call)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import orjson
import pytest

from rollgym.config import BreakerConfig
from rollgym.errors import CircuitOpen, HTTPStatusError
from rollgym.http import HttpClient, Target
from rollgym.http.breaker import CLOSED, HALF_OPEN, OPEN, PROBE, SHUT, CircuitBreaker
from rollgym.http.replicas import ReplicaSet
from tests.support.scripted import Reply, Script, serve_script
from tests.support.stack import fast_policy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(20)


class Replica:
    """One replica: ``/gen`` answers 200 naming it, or 503 while it is ``sick``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sick = False
        self.script = Script(gen=self._reply)
        self.url = ""

    def _reply(self, n: int) -> Reply:
        if self.sick:
            return Reply(503)
        return Reply(200, orjson.dumps({"replica": self.name}))

    @property
    def hits(self) -> int:
        return self.script.hits["/gen"]


@asynccontextmanager
async def two_replicas(**breaker: Any) -> AsyncIterator[tuple[HttpClient, Target, list[Replica]]]:
    """Replicas ``a`` and ``b`` of target ``agent`` (one attempt per call, as ``/run`` has),
    and a client."""
    replicas = [Replica("a"), Replica("b")]
    async with AsyncExitStack() as stack:
        for replica in replicas:
            replica.url = await stack.enter_async_context(serve_script(replica.script))
        client = await stack.enter_async_context(HttpClient())
        policy = fast_policy(max_attempts=1, breaker=breaker)
        yield client, Target("agent", tuple(r.url for r in replicas), policy), replicas


async def answered_by(client: HttpClient, target: Target, **kw: Any) -> str:
    answer = await client.call(target, "/gen", {}, **kw)
    return str(answer["replica"])


def states(client: HttpClient) -> list[str]:
    return [b.state for b in client.breakers("agent")]


async def test_a_sick_replicas_circuit_opens_for_it_alone_and_calls_go_on_to_the_other() -> None:
    async with two_replicas(consecutive_failures=2, cooldown=60) as (client, target, (a, b)):
        a.sick = True
        failed = 0
        for _ in range(6):  # calls one at a time take turns: a gets its two failures
            try:
                assert await answered_by(client, target) == "b"
            except HTTPStatusError as err:
                assert err.status == 503
                failed += 1
        assert (failed, a.hits) == (2, 2)  # it opened after its second failed call
        assert states(client) == [OPEN, CLOSED]

        # Every call now goes to b, and none is refused: the open replica is not chosen.
        assert [await answered_by(client, target) for _ in range(10)] == ["b"] * 10
        assert (a.hits, b.hits) == (2, 14)
        assert states(client) == [OPEN, CLOSED]
        stats = client.stats()["agent"]
        assert (stats.circuit_rejected, stats.failures) == (0, 2)

    # Each replica's breaker is named after it; ``breaker(name)`` is the first replica's.
    assert [br.name for br in client.breakers("agent")] == ["agent[0]", "agent[1]"]
    assert client.breaker("agent") is client.breakers("agent")[0]


async def test_every_replica_open_fails_the_call_as_circuit_open_unsent() -> None:
    async with two_replicas(consecutive_failures=1, cooldown=60) as (client, target, (a, b)):
        a.sick = b.sick = True
        for _ in range(2):
            with pytest.raises(HTTPStatusError):
                await client.call(target, "/gen", {})
        # One failed call each: the second call went to the replica still closed.
        assert (a.hits, b.hits) == (1, 1)
        assert states(client) == [OPEN, OPEN]
        with pytest.raises(CircuitOpen) as info:
            await client.call(target, "/gen", {}, sticky="r1")
        assert (a.hits, b.hits) == (1, 1)
        assert info.value.server == "agent" and info.value.retryable is False
        assert client.stats()["agent"].circuit_rejected == 1


async def test_a_sticky_key_moves_off_an_open_replica_and_a_pinned_one_does_not() -> None:
    async with two_replicas(consecutive_failures=1, cooldown=60) as (client, target, replicas):
        # Three keys on two replicas: two of them share one, their home.
        homes = {key: await answered_by(client, target, sticky=key) for key in ("k0", "k1", "k2")}
        home = max("ab", key=lambda name: list(homes.values()).count(name))
        moving, pinned = [key for key, name in homes.items() if name == home][:2]
        sick, other = (replicas[0], replicas[1]) if home == "a" else (replicas[1], replicas[0])
        sick.sick = True
        with pytest.raises(HTTPStatusError):
            await client.call(target, "/gen", {}, sticky=moving)  # its home fails: opens
        hits = sick.hits

        # Pinned (its state lives there): refused unsent rather than sent elsewhere.
        with pytest.raises(CircuitOpen):
            await client.call(target, "/gen", {}, sticky=pinned, pin=True)
        # Unpinned: the key moves to the replica still closed, and stays there.
        moved = [await answered_by(client, target, sticky=moving) for _ in range(3)]
        assert moved == [other.name] * 3
        assert await answered_by(client, target, sticky=moving, pin=True) == other.name
        assert await answered_by(client, target, sticky=pinned) == other.name
        assert sick.hits == hits
        assert sorted(states(client)) == [CLOSED, OPEN]


async def test_a_replica_due_a_probe_takes_one_call_and_closes_on_its_success() -> None:
    # A cool-down of a microsecond: an open replica is due its probe by the next call.
    async with two_replicas(consecutive_failures=1, cooldown=1e-6) as (client, target, (a, b)):
        b.sick = True
        assert await answered_by(client, target) == "a"  # calls one at a time take turns
        with pytest.raises(HTTPStatusError):
            await client.call(target, "/gen", {})  # b's first failure opens its circuit
        assert states(client) == [CLOSED, OPEN]
        b.sick = False
        b.script.plan("/gen", lambda n: Reply(200, orjson.dumps({"replica": "b"}), delay=30))
        probe = asyncio.create_task(answered_by(client, target))  # due a probe: it goes first
        await wait_until(lambda: b.hits == 2, what="the probe at b")
        assert states(client) == [CLOSED, HALF_OPEN]
        # While the probe is out, every other call goes to a.
        assert [await answered_by(client, target) for _ in range(4)] == ["a"] * 4
        b.script.release.set()
        assert await probe == "b"
        assert (a.hits, b.hits) == (5, 2)
        assert states(client) == [CLOSED, CLOSED]


def test_with_every_replica_shut_a_probe_comes_first_even_with_calls_in_flight() -> None:
    now = [100.0]
    config = BreakerConfig(consecutive_failures=1, cooldown=5)
    breakers = [CircuitBreaker(f"m[{i}]", config, lambda: now[0]) for i in range(2)]
    breakers[0].record(False)
    now[0] += 10  # replica 0 cooled down ...
    breakers[1].record(False)  # ... replica 1 just opened
    assert [b.admits() for b in breakers] == [PROBE, SHUT]
    replicas = ReplicaSet(("http://a", "http://b"))
    replicas.begin(0)  # a call sent before 0 opened is still out
    assert replicas.order(None, breakers) == [0, 1]
    assert replicas.pick(None, breakers) == 0
    assert replicas.order(None, [None, None]) == [1, 0]  # no breakers: least outstanding
    assert [b.admits() for b in breakers] == [PROBE, SHUT]  # asked, not changed
