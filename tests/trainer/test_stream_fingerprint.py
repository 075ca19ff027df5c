"""The trainer's stream asks every replica which environment scores its rollouts (issue 41,
item 3): each agent replica, and through each, every replica of its resources server. Replicas
that answer different fingerprints stop the stream before its first rollout, naming them; a
stream over replicas that agree records their one fingerprint. Real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.errors import ConfigError
from rollgym.server.fingerprint import Fingerprint
from rollgym.trainer import RolloutClient
from rollgym.wire import FINGERPRINT_ENDPOINT
from tests.support.servers import CountingEcho
from tests.support.stack import running_stack, task_row

pytestmark = pytest.mark.timeout(60)


class _Retrained(CountingEcho):
    """Another version of the env: what a replica left running from an older checkout is."""

    version = "2"


OLD = Fingerprint.of(CountingEcho).id
NEW = Fingerprint.of(_Retrained, version="2").id


async def test_an_agents_resources_replicas_that_differ_stop_the_stream(tmp_path: Path) -> None:
    """The agent's env has two replicas (either may score any rollout) that differ: the
    stream refuses to start, naming both and the part that differs; nothing is sent."""
    async with running_stack(env_replica=_Retrained) as stack:
        async with RolloutClient(stack.agent_url) as client:
            stream = client.stream([task_row(0)], repeats=2, output=tmp_path / "run")
            with pytest.raises(ConfigError) as raised:
                async with stream:
                    pass
        assert stack.env.calls["seed_session"] == 0
    said = str(raised.value)
    one, two = stack.urls["env"]
    assert said.startswith("server agent: its replicas are scored by different environments")
    agent = f"agent replica 0 ({stack.agent_url})"
    assert f"{agent} -> env replica 0 ({one}) fingerprint {OLD}" in said
    assert f"{agent} -> env replica 1 ({two}) fingerprint {NEW}" in said
    assert "version: None -> '2'" in said
    assert not (tmp_path / "run" / "rollouts.jsonl").exists()


async def test_agent_replicas_scored_by_different_environments_stop_the_stream() -> None:
    """Two agent replicas, each in front of another version of the env: refused, naming the
    agent replicas and both fingerprints."""
    async with (
        running_stack() as first,
        running_stack(env=_Retrained) as second,
        RolloutClient([first.agent_url, second.agent_url]) as client,
    ):
        with pytest.raises(ConfigError) as raised:
            async with client.stream([task_row(0)], repeats=2):
                pass
        assert first.env.calls["seed_session"] == second.env.calls["seed_session"] == 0
    said = str(raised.value)
    assert f"agent replica 0 ({first.agent_url}) fingerprint {OLD}" in said
    assert f"agent replica 1 ({second.agent_url}) fingerprint {NEW}" in said


async def test_replicas_that_agree_are_recorded_once(tmp_path: Path) -> None:
    """Every replica asked, all agree: the stream runs and its lines carry that one id."""
    async with (
        running_stack(env_replica=CountingEcho) as first,
        running_stack() as second,
        RolloutClient([first.agent_url, second.agent_url]) as client,
        client.stream([task_row(i) for i in range(3)], output=tmp_path / "r") as stream,
    ):
        assert len([g async for g in stream]) == 3
    info = orjson.loads((tmp_path / "r" / "run.json").read_bytes())
    assert info["fingerprints"] == {"agent": first.env.fingerprint.to_dict()}
    lines = (tmp_path / "r" / "rollouts.jsonl").read_bytes().splitlines()
    assert {orjson.loads(line)["rollgym_fingerprint"] for line in lines} == {OLD}


class _SlowToSay(CountingEcho):
    """A replica of the same env whose ``/fingerprint`` does not answer in time (a loaded
    machine, a long GC pause); every other route answers as the env's does."""

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        async def stuck(request: Any) -> Any:
            await asyncio.sleep(3600)  # never in time: cancelled when the server stops

        said = [r for r in super().routes() if getattr(r, "path", None) != FINGERPRINT_ENDPOINT]
        return [Route(FINGERPRINT_ENDPOINT, stuck, methods=["GET", "POST"]), *said]


async def test_a_replica_slow_to_say_its_fingerprint_leaves_the_others_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One of the env's two replicas never answers ``/fingerprint``: the agent asks each for
    at most ``ASK_TIMEOUT`` and answers the one that did, and the stream waits long enough for
    that answer: it runs, records the env's fingerprint and warns about the replica (it gave
    none); it neither stops nor drops the whole server's fingerprint as unknown."""
    async with (
        running_stack(env_replica=_SlowToSay) as stack,
        RolloutClient(stack.agent_url) as client,
        client.stream([task_row(i) for i in range(2)], output=tmp_path / "r") as stream,
    ):
        assert len([g async for g in stream]) == 2
    info = orjson.loads((tmp_path / "r" / "run.json").read_bytes())
    assert info["fingerprints"] == {"agent": stack.env.fingerprint.to_dict()}
    lines = (tmp_path / "r" / "rollouts.jsonl").read_bytes().splitlines()
    assert {orjson.loads(line)["rollgym_fingerprint"] for line in lines} == {OLD}
    slow = stack.urls["env"][1]
    assert f"server env: env replica 1 ({slow}): no /fingerprint" in caplog.text
