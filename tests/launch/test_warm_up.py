"""A server whose scoring pool warms up past the start-up bound is waited for (it answers
``/health`` with ``starting`` meanwhile) under the longer warm-up bound; a process that never
answers still fails at the start-up bound; a warm-up that fails, or outlasts the warm-up bound,
fails the launch naming why. Real server processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest

from rollgym.collect.launchers import RunningServers, check_reachable
from rollgym.errors import LaunchError, RollgymError
from rollgym.http import HttpClient, LeanTransport, Request
from rollgym.launch import ProcessGroup, ServerSpec
from tests.launch.slow_warm import WARM_VAR
from tests.launch.test_group import servers_config

pytestmark = pytest.mark.timeout(90)

STARTUP = 10.0
"""The start-up bound of these tests: time enough for a server process to import rollgym and
answer on a busy machine; its pool's warm-up is made to last past it."""


async def _health(url: str) -> dict[str, object]:
    answer = await LeanTransport().send(
        Request(url + "/health", b"{}", None, 5.0, 5.0, "health", "/health")
    )
    said = orjson.loads(answer.body)
    assert isinstance(said, dict)
    return said


async def test_a_pool_warming_past_the_startup_bound_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WARM_VAR, str(STARTUP + 3))
    group = ProcessGroup(servers_config(env="tests.launch.slow_warm:SlowWarmUp"))
    started = time.monotonic()
    try:
        urls = await group.start([ServerSpec("env")], {}, timeout=STARTUP)
        # Not before its warm-up ended (the sleep is past the start-up bound): the wait did
        # go on beyond that bound, and ended because the server was ready.
        assert time.monotonic() - started > STARTUP
        assert (await _health(urls["env"][0]))["status"] == "ok"
    finally:
        await group.stop()


async def test_a_server_that_never_answers_still_fails_at_the_startup_bound() -> None:
    """A warm-up bound far longer than the test's own time limit: only the start-up bound can
    end this wait (a server that never answered is not warming up)."""
    config = servers_config(env="tests.launch.crashing:HangOnStart")
    group = ProcessGroup(config, warmup_timeout=3600, stop_grace=2.0)
    with pytest.raises(LaunchError) as info:
        await group.start([ServerSpec("env")], {}, timeout=5)
    assert "server env not healthy after 5s" in info.value.message


async def test_a_warm_up_past_the_warm_up_bound_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(WARM_VAR, "600")
    group = ProcessGroup(
        servers_config(env="tests.launch.slow_warm:SlowWarmUp"),
        log_dir=tmp_path,
        warmup_timeout=STARTUP + 3,
    )
    with pytest.raises(LaunchError) as info:
        await group.start([ServerSpec("env")], {}, timeout=STARTUP)
    said = info.value.message
    assert f"server env not healthy after {STARTUP + 3:g}s" in said
    assert "still warming up (warming 1 scoring worker(s) (tests.launch.slow_warm))" in said
    # The warm-up cancelled as the server stopped leaves no asyncio ERROR in its log (a
    # gather whose CancelledError nobody read), which would send a reader down a false trail.
    assert "never retrieved" not in (tmp_path / "env.0.log").read_text()


async def test_a_warm_up_that_fails_fails_the_launch_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WARM_VAR, "fail")
    group = ProcessGroup(servers_config(env="tests.launch.slow_warm:SlowWarmUp"))
    with pytest.raises(LaunchError) as info:
        await group.start([ServerSpec("env")], {}, timeout=60)  # not waited out
    said = info.value.message
    assert said.startswith("server env failed while starting")
    assert "RuntimeError: the scoring tables are missing" in said


async def test_a_running_server_whose_warm_up_failed_is_not_taken_as_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rollgym collect`` against servers it did not start (``RunningServers``) takes any
    answer as "up"; a server that says its warm-up failed would fail every verify (each one
    warming a pool again), after every rollout's model calls were paid for."""
    monkeypatch.setenv(WARM_VAR, "fail")
    group = ProcessGroup(servers_config(env="tests.launch.slow_warm:SlowWarmUp"))
    try:
        url = await _spawned_saying(group, "failed")
        with pytest.raises(LaunchError) as info:
            await RunningServers({"env": [url]}).start()
        said = info.value.message
        assert f"env at {url}" in said and "the scoring tables are missing" in said
    finally:
        await group.stop()


async def _spawned_saying(group: ProcessGroup, status: str) -> str:
    """A server spawned by ``group``, once its ``/health`` says ``status``; its URL."""
    url = group.bind(ServerSpec("env")).url
    group.spawn({"env": [url]})
    deadline = time.monotonic() + 60
    while True:
        try:
            if (await _health(url))["status"] == status:
                return url
        except RollgymError:
            pass  # not listening yet
        assert time.monotonic() < deadline, f"the server never said {status!r}"
        await asyncio.sleep(0.1)


async def test_a_running_server_still_warming_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against servers it did not start, the run waits for one still warming: it reads each
    server's ``/health`` at its start (code, the row fields it needs), which answers once warm."""
    monkeypatch.setenv(WARM_VAR, "4")
    group = ProcessGroup(servers_config(env="tests.launch.slow_warm:SlowWarmUp"))
    try:
        url = await _spawned_saying(group, "starting")
        await RunningServers({"env": [url]}).start()
        assert (await _health(url))["status"] == "ok"  # returned once warm, not before
    finally:
        await group.stop()


async def test_a_running_server_warming_past_the_bound_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WARM_VAR, "600")
    group = ProcessGroup(servers_config(env="tests.launch.slow_warm:SlowWarmUp"))
    try:
        url = await _spawned_saying(group, "starting")
        async with HttpClient() as http:
            with pytest.raises(LaunchError) as info:
                await check_reachable(http, {"env": [url]}, warmup_timeout=1.0)
        assert f"env at {url}: still warming up after 1s" in info.value.message
    finally:
        await group.stop()
