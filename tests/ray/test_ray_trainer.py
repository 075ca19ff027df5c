"""The trainer API inside Ray actors and ``spawn`` processes, against a model that is down.

The model answers 503 to every call (beyond its 3 attempts), so every rollout fails in the
agent: the agent answers 502 with the model's error as ``origin``. Records and raised errors
must reach the driver with their type and fields intact.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import ray
from ray.exceptions import RayTaskError

from rollgym.errors import HTTPStatusError, RollgymError
from rollgym.ray import RayServers
from rollgym.trainer import (
    FailedRollout,
    RolloutClient,
    TaskGroup,
    collect_batch,
    collect_batch_sync,
    plain_error,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def failing_agent(
    ray_cluster: Any, overloaded_model: str, stack: Any, tmp_path_factory: Any
) -> Iterator[str]:
    """An agent (+ echo env) started on the cluster, whose model answers 503."""
    servers = RayServers(
        stack.config(model_url=overloaded_model, replicas=1),
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    urls = asyncio.run(servers.start())
    try:
        yield urls["agent"][0]
    finally:
        asyncio.run(servers.stop())


def _rows(stack: Any, n: int = 3) -> list[dict[str, Any]]:
    return [stack.task_row(i) for i in range(n)]


def _check_error(err: RollgymError) -> None:
    """The agent's 502, carrying the model's 503 as its origin, every field in place."""
    assert isinstance(err, HTTPStatusError)
    assert err.status == 502
    assert err.server == "agent"
    assert err.endpoint == "/run"
    assert err.body is not None and "overloaded" in err.body
    assert err.retryable is False
    root = err.root()
    assert isinstance(root, HTTPStatusError)
    assert (root.status, root.server, root.attempts) == (503, "model", 3)


def _check_groups(groups: list[TaskGroup], rows: int, repeats: int) -> None:
    assert [g.task_index for g in groups] == list(range(rows))
    for group in groups:
        assert [r.rollout_index for r in group.rollouts] == list(range(repeats))
        assert group.rewards == [] and not group.complete
        for record in group.rollouts:
            assert isinstance(record, FailedRollout)
            _check_error(record.error)


def test_records_come_back_from_a_ray_actor(failing_agent: str, stack: Any) -> None:
    actor = ray.remote(RolloutClient).remote(failing_agent)
    groups = ray.get(actor.collect_sync.remote(_rows(stack), repeats=2, concurrency=4))
    _check_groups(groups, rows=3, repeats=2)
    # async form, on the actor's own event loop
    groups = ray.get(actor.collect.remote(_rows(stack, 2), repeats=3))
    _check_groups(groups, rows=2, repeats=3)
    ray.kill(actor)


def test_strict_error_crosses_ray_get_with_its_fields(failing_agent: str, stack: Any) -> None:
    actor = ray.remote(RolloutClient).remote(failing_agent)
    for method in (actor.collect_sync, actor.collect):
        with pytest.raises(HTTPStatusError) as caught:
            ray.get(method.remote(_rows(stack), repeats=2, strict=True))
        err = caught.value
        assert isinstance(err, RayTaskError)  # Ray's dual class: ours and RayTaskError
        _check_error(err)
        plain = plain_error(err)
        assert type(plain) is HTTPStatusError
        again = pickle.loads(pickle.dumps(plain))
        assert again == plain
        _check_error(again)
    ray.kill(actor)


def test_strict_error_from_a_ray_task(failing_agent: str, stack: Any) -> None:
    task = ray.remote(collect_batch_sync)
    with pytest.raises(HTTPStatusError) as caught:
        ray.get(task.remote(_rows(stack), agent=failing_agent, strict=True))
    _check_error(caught.value)
    groups = ray.get(task.remote(_rows(stack, 1), agent=failing_agent, repeats=2))
    _check_groups(groups, rows=1, repeats=2)


def test_records_and_errors_cross_a_spawn_process(failing_agent: str, stack: Any) -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        groups = pool.submit(collect_batch_sync, _rows(stack), agent=failing_agent, repeats=2)
        _check_groups(groups.result(timeout=60), rows=3, repeats=2)
        strict = pool.submit(collect_batch_sync, _rows(stack), agent=failing_agent, strict=True)
        with pytest.raises(HTTPStatusError) as caught:
            strict.result(timeout=60)
    assert type(caught.value) is HTTPStatusError
    _check_error(caught.value)


async def test_strict_cancels_the_other_rollouts(failing_agent: str, stack: Any) -> None:
    client = RolloutClient(failing_agent)
    try:
        with pytest.raises(HTTPStatusError) as caught:
            await collect_batch(_rows(stack, 8), agent=client, repeats=4, strict=True)
        _check_error(caught.value)
        # nothing is left running on the client's loop after the raise
        current = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not current and not t.done()] == []
    finally:
        await client.aclose()


def test_records_pickle(failing_agent: str, stack: Any) -> None:
    with RolloutClient(failing_agent) as client:
        groups = client.collect_sync(_rows(stack, 1), repeats=2)
        again = pickle.loads(pickle.dumps(groups))
        client2 = pickle.loads(pickle.dumps(client))
        assert client2.target == client.target
    assert again == groups
    _check_groups(again, rows=1, repeats=2)
