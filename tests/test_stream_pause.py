"""A weight update in the middle of a stream, against a real rollgym model server (its policy
gate): 512 rollouts in flight, a pause that aborts the model calls running upstream, a resume
with the next version; every rollout is recorded exactly once, none failed, and the aborted
calls say so on their record. Also: the typed outcomes of a model server that does not answer
a pause, or is gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from rollgym.errors import ConnectError, DeadlineExceeded
from rollgym.models.scripted import ScriptedModel
from rollgym.testing import serve_server
from rollgym.trainer import PolicyControl, RolloutClient, ScoredRollout
from rollgym.wire import ABORTED_VERSIONS
from tests.support.servers import port_of, refused_url
from tests.support.stack import running_stack, task_row
from tests.support.waiting import wait_until
from tests.test_stream import assert_ledger_exact

pytestmark = pytest.mark.timeout(120)

IN_FLIGHT = 512


async def test_a_pause_mid_run_with_512_in_flight_loses_and_fails_nothing(tmp_path: Path) -> None:
    rows = [task_row(i) for i in range(IN_FLIGHT)]  # x2 repeats: 1,024 rollouts, 512 at once
    options = {"latency": 0.3}  # each model call takes a while: many run upstream at the pause
    async with (
        running_stack(model_options=options) as stack,
        RolloutClient(stack.agent_url) as client,
    ):
        gate = stack.model.policy
        stream = client.stream(
            rows, repeats=2, concurrency=IN_FLIGHT, output=tmp_path / "run",
            control=PolicyControl(stack.urls["model"]), max_staleness=None,
        )  # fmt: skip
        groups = []
        async with stream:
            it = aiter(stream)
            await wait_until(
                lambda: stream.in_flight == IN_FLIGHT and gate.in_flight >= 100,
                timeout=60, what="512 rollouts in flight, many model calls upstream",
            )  # fmt: skip
            answers = await stream.pause(abort=True, timeout_s=60)
            aborted = sum(a.aborted for a in answers)
            assert aborted > 0 and gate.in_flight == 0
            await stream.resume(1)
            async for group in it:
                groups.append(group)
    assert sorted(g.task_index for g in groups) == list(range(IN_FLIGHT))
    records = [r for g in groups for r in g.rollouts]
    assert len(records) == 2 * IN_FLIGHT and all(isinstance(r, ScoredRollout) for r in records)
    assert stream.stats.failed == 0 and stream.stats.stale == 0 and stream.stats.reruns == 0
    assert all(g.complete and g.rewards == [1.0, 1.0] for g in groups)
    # Every model call of every record says the version it ran under: 0 before the pause, 1
    # after (a call aborted by the pause ran again under 1).
    for r in records:
        assert len(r.policy_versions) == 2 and set(r.policy_versions) <= {0, 1}
        assert list(r.policy_versions) == sorted(r.policy_versions)
    # The aborted calls were re-issued under version 1 and their records say what happened.
    re_issued = [
        r for r in records
        for call in r.response["rollgym_upstream"] if call.get(ABORTED_VERSIONS) == [0]
    ]  # fmt: skip
    assert len(re_issued) == aborted
    assert all(1 in r.policy_versions for r in re_issued)
    info = assert_ledger_exact(tmp_path / "run")
    assert info["status"] == "completed"
    assert info["counts"]["scored"] == 2 * IN_FLIGHT and info["counts"]["unfinished"] == 0


@asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A server that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_model_server_that_does_not_answer_a_pause_is_a_typed_error() -> None:
    """One server pauses, the other never answers: the pause raises within its deadline, and
    the server that paused is resumed (nothing stays half-paused)."""
    async with running_stack() as stack, silent_server() as silent:
        gate = stack.model.policy
        control = PolicyControl([stack.urls["model"][0], silent], call_timeout=0.5)
        with pytest.raises(DeadlineExceeded) as caught:
            await asyncio.wait_for(control.pause(abort=True, timeout_s=30), 10)
        assert caught.value.server is not None
        assert not gate.paused and not control.paused
        await control.aclose()


async def test_a_model_server_gone_during_a_pause_fails_the_resume_typed() -> None:
    async with serve_server(ScriptedModel, name="model") as (url, model):
        control = PolicyControl([url], call_timeout=2)
        await control.pause(timeout_s=30)
        assert model.policy.paused
    # The server is gone (stopped while paused): the resume is a typed error, not a hang. Its
    # port is held from the moment it stopped, so that no other process takes it and answers.
    with refused_url(port_of(url)), pytest.raises(ConnectError) as caught:
        await asyncio.wait_for(control.resume(1), 10)
    assert caught.value.server == "model[0]" and url.split("//")[1] in caught.value.message
    assert control.version == 0 and control.paused
    await control.aclose()
