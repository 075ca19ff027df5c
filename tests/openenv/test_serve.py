"""A rollgym environment served as an OpenEnv environment (``rollgym.openenv.serve``), driven by
OpenEnv's own client classes (openenv-core 0.3.0's ``GenericEnvClient``, async and sync): the
bundled ``lookup`` environment's tools and verifier, unchanged behind openenv-core's server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv.core", reason="needs openenv-core (the dev extra)")

from openenv.core import GenericEnvClient
from websockets.exceptions import ConnectionClosed

from rollgym.envs.lookup.server import LookupEnv
from rollgym.http import Target
from rollgym.openenv.serve import openenv_app, shown_verdict
from rollgym.server.resources import Session, tool
from rollgym.testing import serve_asgi, serve_server
from rollgym.wire import MASK_SAMPLE

pytestmark = pytest.mark.timeout(60)

LOOKUP_ROWS = Path(__file__).parents[2] / "src/rollgym/envs/lookup/data/example.jsonl"


class MaskedLookup(LookupEnv):
    """lookup, except that every verdict is masked (as a scorer whose worker was lost)."""

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        return {**await super().verify(session, task, response), MASK_SAMPLE: True}


def rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in LOOKUP_ROWS.read_text().splitlines() if line.strip()]


@asynccontextmanager
async def served(max_envs: int = 4, *, rows_too: bool = True) -> AsyncIterator[str]:
    async with served_with(max_envs, rows_too=rows_too) as (url, _):
        yield url


@asynccontextmanager
async def served_with(
    max_envs: int = 4, *, rows_too: bool = True
) -> AsyncIterator[tuple[str, Any]]:
    """The OpenEnv app's URL and the rollgym server behind it (its sessions can be counted)."""
    async with serve_server("lookup", name="lookup") as (url, server):
        target = Target.single("lookup", url)
        app = openenv_app(target, tasks=rows(), max_concurrent_envs=max_envs, rows=rows_too)
        async with serve_asgi(app) as openenv_url:
            yield openenv_url, server


def client(url: str) -> Any:
    return GenericEnvClient(base_url=url, message_timeout_s=15, connect_timeout_s=5)


async def test_a_rollgym_environment_played_by_openenvs_client_scores_as_its_verifier() -> None:
    row = rows()[0]
    expected = row["expected_answer"]
    async with served() as url, client(url) as env:
        first = await env.reset(task_index=0)
        assert first.done is False and first.reward is None
        assert first.observation["prompt"] == row["responses_create_params"]["input"]
        assert [t["name"] for t in first.observation["tools"]] == ["lookup"]
        looked = await env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
        assert expected in looked.observation["output"].replace(",", "")
        right = await env.step({"answer": f"The population is {expected}."})
        assert (right.done, right.reward) == (True, 1.0)
        # A new episode on the same socket: a wrong answer scores what the verifier says.
        await env.reset(**row)  # the row itself, as TRL passes a dataset row's columns
        wrong = await env.step({"answer": "About 12."})
        assert (wrong.done, wrong.reward) == (True, 0.0)


async def test_an_openenv_client_cannot_reach_endpoints_that_are_not_tools() -> None:
    async with served() as url, client(url) as env:
        await env.reset(seed=7)  # seed picks a row: 7 mod n
        for name in ("verify", "seed_session", "../verify", "nonexistent"):
            refused = await env.step({"tool": name, "arguments": {}})
            assert "unknown tool" in refused.observation["output"] and refused.reward is None
        both = await env.step({"tool": "lookup", "answer": "both"})  # exactly one of the two
        assert "either" in both.observation["output"] and not both.done
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            await env.step({"tool": "lookup", "arguments": {}, "smuggled": 1})
        done = await env.step({"answer": "no idea"})
        assert done.done and done.reward == 0.0
        with pytest.raises(RuntimeError, match=r"reset first.*EXECUTION_ERROR"):
            await env.step({"answer": "again, to score twice"})


async def test_a_callers_row_with_its_own_answer_key_is_refused_by_default() -> None:
    forged = {**rows()[0], "expected_answer": "7"}  # the caller's own answer key
    async with serve_server("lookup", name="lookup") as (lookup_url, _):
        app = openenv_app(Target.single("lookup", lookup_url), tasks=rows())  # the defaults
        async with serve_asgi(app) as url, client(url) as env:
            with pytest.raises(RuntimeError, match="own tasks only"):
                await env.reset(**forged)
    async with served(rows_too=False) as url, client(url) as env:
        await env.reset(task_index=0)  # a served task: its answer key is the server's
        await env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
        assert (await env.step({"answer": "7"})).reward == 0.0


async def test_sessions_are_separate_and_capacity_is_openenvs() -> None:
    async with served(max_envs=2) as url:
        a, b, c = client(url), client(url), client(url)
        async with a, b:
            await asyncio.gather(a.reset(task_index=0), b.reset(task_index=1))
            # lookup pays only an answer found with its tool; each session calls it once
            for env in (a, b):
                await env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
            ra = await a.step({"answer": rows()[0]["expected_answer"]})
            rb = await b.step({"answer": rows()[0]["expected_answer"]})  # row 1's answer differs
            assert (ra.reward, rb.reward) == (1.0, 0.0)
            # openenv-core refuses the third: its client reads the CAPACITY_REACHED answer,
            # or (when the server's close overtakes its reset) fails to send on a closed socket
            with pytest.raises((RuntimeError, ConnectionClosed)) as refused:
                await c.reset(task_index=0)
            if isinstance(refused.value, RuntimeError):
                assert "CAPACITY_REACHED" in str(refused.value)
            await c.close()


def test_the_sync_client_works_too() -> None:
    async def main() -> None:
        async with served() as url:
            await asyncio.to_thread(play, url)

    def play(url: str) -> None:
        with client(url).sync() as env:
            env.reset(task_index=0)
            env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
            assert env.step({"answer": rows()[0]["expected_answer"]}).reward == 1.0

    asyncio.run(main())


def test_the_serve_openenv_command_serves_a_configs_environment(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    config = LOOKUP_ROWS.parents[1] / "config.yaml"
    url_file = tmp_path / "url"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollgym", "serve-openenv", str(config), "--env", "lookup",
         "--port", "0", "--max-sessions", "2", "--write-url", str(url_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not url_file.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "serve-openenv did not come up within 60 s"
            time.sleep(0.1)
        url = url_file.read_text()

        def play() -> float:
            with client(url).sync() as env:
                first = env.reset(task_index=0)  # collect.input of the config: lookup's rows
                assert "Brackenholt" in str(first.observation["prompt"])
                env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
                return float(env.step({"answer": rows()[0]["expected_answer"]}).reward)

        assert play() == 1.0
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out
    assert b"OpenEnv environment 'lookup' (" in out
    # openenv-core's client closes before the server's own close: no traceback for that.
    assert b"Traceback" not in out and b"Exception in ASGI" not in out, out.decode()
    assert not url_file.exists()  # removed on the way out: no stale URL


async def test_abandoned_episodes_hold_no_rollgym_session() -> None:
    """Resets without an answer, a closed socket and stateless HTTP /reset each close the
    rollgym session they opened: the server behind holds none of them afterwards."""
    import aiohttp

    async with served_with() as (url, server):
        async with client(url) as env:
            for i in range(5):
                await env.reset(task_index=i % len(rows()))  # each abandons the one before
            assert len(server._sessions) == 1  # only the open episode's
            await env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            for _ in range(5):
                async with http.post(url + "/reset", json={"task_index": 0}) as resp:
                    assert resp.status == 200, await resp.text()
        async with asyncio.timeout(10):  # the closes are sent without waiting for them
            while len(server._sessions):  # noqa: ASYNC110 (the server's store has no event)
                await asyncio.sleep(0.02)
        # An answered episode ended its session itself (/verify): nothing left to close.
        async with client(url) as env:
            await env.reset(task_index=0)
            await env.step({"answer": "no idea"})
        assert len(server._sessions) == 0


async def test_a_masked_verdict_is_no_reward_not_a_zero() -> None:
    async with serve_server(MaskedLookup, name="lookup") as (lookup_url, _):
        app = openenv_app(Target.single("lookup", lookup_url), tasks=rows())
        async with serve_asgi(app) as url, client(url) as env:
            await env.reset(task_index=0)
            done = await env.step({"answer": "no idea"})
    assert done.done is True and done.reward is None
    assert done.observation["verified"][MASK_SAMPLE] is True


def test_a_verdict_shows_the_client_its_numbers_and_flags_only() -> None:
    """A judge's evaluations quote the reference, a guard's reason can tell the reference's
    names or length; a client replaying the task would read them."""
    verified = {
        "reward": 1.0, "response": {"output": []}, "expected_answer": "Paris",
        "judge_evaluations": [{"text": "The reference, Paris, matches. [[A=B]]"}],
        "accuracy": 1.0, "answer_found": True, "reason": "correct", "extracted_answer": "Paris",
        "explanation": "x" * 201, "details": {"gold": "Paris"}, "missing": None,
    }  # fmt: skip
    shown = shown_verdict(verified, {"expected_answer": "Paris", "responses_create_params": {}})
    assert shown == {"accuracy": 1.0, "answer_found": True, "missing": None}


class CountingLookup(LookupEnv):
    """lookup, counting the tool calls that reach it."""

    looked = 0

    @tool
    async def lookup(self, session: Session, key: str) -> dict[str, Any]:
        """Look up a Norrowvale registry entry by key."""
        type(self).looked += 1
        return await super().lookup(session, key)


async def test_an_episode_sends_at_most_max_tool_calls() -> None:
    # Each step of a client was one tool call on the rollgym server, without a bound.
    CountingLookup.looked = 0
    async with serve_server(CountingLookup, name="lookup") as (lookup_url, _):
        app = openenv_app(Target.single("lookup", lookup_url), tasks=rows(), max_tool_calls=3)
        async with serve_asgi(app) as url, client(url) as env:
            await env.reset(task_index=0)
            steps = [
                await env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
                for _ in range(5)
            ]
            assert CountingLookup.looked == 3
            spent = "not run: the rollout's 3 tool calls (max_tool_calls) are spent"
            assert [json.loads(s.observation["output"]).get("error") for s in steps] == [
                *[None] * 3, spent, spent,
            ]  # fmt: skip
            await env.reset(task_index=0)  # a new episode has its own budget
            await env.step({"tool": "lookup", "arguments": {"key": "Brackenholt"}})
            assert CountingLookup.looked == 4
