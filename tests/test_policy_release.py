"""A trainer's pause never leaves a model server paused behind its back (review findings): a
pause without ``abort`` that waits longer than ``call_timeout`` for calls in flight, a failed
pause rolled back against servers already at a later version, a pause answered after it
expired, a pause request dropped mid-wait, and a stream closed while paused (or after setting
a staleness bound)."""

from __future__ import annotations

import asyncio

import pytest

from rollgym.errors import DeadlineExceeded, ProtocolError
from rollgym.server.policy import PolicyGate
from rollgym.testing import serve_server
from rollgym.trainer import PolicyControl, RolloutClient
from tests.models.held_model import HeldModel
from tests.support.stack import running_stack, task_row
from tests.support.waiting import wait_until
from tests.test_stream_pause import silent_server

pytestmark = pytest.mark.timeout(120)


async def test_a_dropped_pause_request_undoes_the_pause_it_made() -> None:
    gate = PolicyGate("model")
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        return 1

    call = asyncio.ensure_future(gate.run(None, work))
    await wait_until(lambda: gate.in_flight == 1, timeout=10, what="a call in flight")
    pausing = asyncio.ensure_future(gate.pause(abort=False, timeout_s=60))
    await wait_until(lambda: gate.paused, timeout=10, what="the gate paused")
    pausing.cancel()  # the trainer's request went away while the gate waited for the call
    await asyncio.gather(pausing, return_exceptions=True)
    assert not gate.paused
    release.set()
    assert (await asyncio.wait_for(call, 10)).value == 1
    # A new call is not held (it would be, until the pause's deadline, had the pause stayed).
    assert (await asyncio.wait_for(gate.run(None, work), 10)).value == 1


async def test_a_pause_without_abort_may_wait_past_call_timeout_for_calls_in_flight() -> None:
    async with serve_server(HeldModel, name="model") as (url, model):
        model.go.clear()
        control = PolicyControl([url], call_timeout=0.5)
        gate = model.policy

        async def one_call() -> None:
            await model.policy.run(None, lambda: model.go.wait())

        call = asyncio.ensure_future(one_call())
        await wait_until(lambda: gate.in_flight == 1, timeout=10, what="a call in flight")
        pausing = asyncio.ensure_future(control.pause(abort=False, timeout_s=30))
        await asyncio.sleep(1.5)  # three call_timeouts: the pause is still waiting, not failed
        assert not pausing.done() and gate.paused
        model.go.set()
        answers = await asyncio.wait_for(pausing, 20)
        assert control.paused and gate.paused and answers[0].held == 0
        await control.resume(1)
        assert not gate.paused and gate.version == 1
        await asyncio.wait_for(call, 10)
        await control.aclose()


async def test_a_failed_pause_releases_servers_already_at_a_later_version() -> None:
    async with running_stack() as stack, silent_server() as silent:
        gate = stack.model.policy
        gate.resume(3, None, set_staleness=False)  # an earlier trainer got it to version 3
        control = PolicyControl([stack.urls["model"][0], silent], call_timeout=0.5)
        assert control.version == 0  # a new trainer process that does not know it
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(control.pause(abort=True, timeout_s=30), 20)
        assert not gate.paused and gate.version == 3 and not control.paused
        await control.aclose()


async def test_a_pause_that_expired_before_its_answer_is_a_failed_pause() -> None:
    async with serve_server(HeldModel, name="model") as (url, model):
        model.go.clear()
        gate = model.policy
        call = asyncio.ensure_future(gate.run(None, lambda: model.go.wait()))
        await wait_until(lambda: gate.in_flight == 1, timeout=10, what="a call in flight")
        control = PolicyControl([url], call_timeout=5)
        # The call outlasts the pause: the server unpauses itself before it can answer.
        with pytest.raises(ProtocolError, match="already ended"):
            await asyncio.wait_for(control.pause(abort=False, timeout_s=0.5), 20)
        assert not control.paused and not gate.paused
        model.go.set()
        await asyncio.wait_for(call, 10)
        await control.aclose()


async def test_a_stream_closed_while_paused_releases_the_model_servers() -> None:
    async with running_stack() as stack, RolloutClient(stack.agent_url) as client:
        gate = stack.model.policy
        control = PolicyControl(stack.urls["model"])
        rows = [task_row(i) for i in range(4)]
        with pytest.raises(RuntimeError, match="training step failed"):
            async with client.stream(rows, control=control, max_staleness=1) as stream:
                async for _ in stream:
                    await stream.pause(timeout_s=60)
                    await stream.resume(1)  # the stream's bound goes to the servers
                    assert gate.max_staleness == 1
                    await stream.pause(timeout_s=60)
                    assert gate.paused
                    raise RuntimeError("training step failed")
        # Released at close: not paused, and the staleness bound this stream set is lifted.
        assert not gate.paused and gate.max_staleness is None
        groups = await client.collect([task_row(0)], repeats=2)
        assert groups[0].complete
