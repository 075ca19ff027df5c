"""The trainer API inside Ray actors and tasks, against a model that is down (the rest of the
trainer API, ``spawn`` processes included, is tested without Ray in ``tests/test_trainer.py``).

The model answers 503 to every call (beyond its 3 attempts), so every rollout fails in the
agent: the agent answers 502 with the model's error as ``origin``. Records and raised errors
must reach the driver with their type and fields intact.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray.exceptions import RayTaskError

from rollgym.errors import HTTPStatusError
from rollgym.ray import RayServers
from rollgym.trainer import RolloutClient, collect_batch_sync, plain_error
from tests.support.failures import assert_failed_groups, assert_model_failure
from tests.support.stack import stack_config, task_row

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def failing_agent(ray_cluster: Any, down_model: str, tmp_path_factory: Any) -> Iterator[str]:
    """An agent (+ echo env) started on the cluster, whose model answers 503."""
    servers = RayServers(
        stack_config(model={"url": down_model}, replicas=1),
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    urls = asyncio.run(servers.start())
    try:
        yield urls["agent"][0]
    finally:
        asyncio.run(servers.stop())


def _rows(n: int = 3) -> list[dict[str, Any]]:
    return [task_row(i) for i in range(n)]


def test_records_come_back_from_a_ray_actor(failing_agent: str) -> None:
    actor = ray.remote(RolloutClient).remote(failing_agent)
    groups = ray.get(actor.collect_sync.remote(_rows(), repeats=2, concurrency=4))
    assert_failed_groups(groups, 3, 2, 503)
    # async form, on the actor's own event loop
    groups = ray.get(actor.collect.remote(_rows(2), repeats=3))
    assert_failed_groups(groups, 2, 3, 503)
    ray.kill(actor)


def test_strict_error_crosses_ray_get_with_its_fields(failing_agent: str) -> None:
    actor = ray.remote(RolloutClient).remote(failing_agent)
    for method in (actor.collect_sync, actor.collect):
        with pytest.raises(HTTPStatusError) as caught:
            ray.get(method.remote(_rows(), repeats=2, strict=True))
        err = caught.value
        assert isinstance(err, RayTaskError)  # Ray's dual class: ours and RayTaskError
        assert_model_failure(err, 503)
        plain = plain_error(err)
        assert type(plain) is HTTPStatusError
        again = pickle.loads(pickle.dumps(plain))
        assert again == plain
        assert_model_failure(again, 503)
    ray.kill(actor)


def test_strict_error_from_a_ray_task(failing_agent: str) -> None:
    task = ray.remote(collect_batch_sync)
    with pytest.raises(HTTPStatusError) as caught:
        ray.get(task.remote(_rows(), agent=failing_agent, strict=True))
    assert_model_failure(caught.value, 503)
    groups = ray.get(task.remote(_rows(1), agent=failing_agent, repeats=2))
    assert_failed_groups(groups, 1, 2, 503)
