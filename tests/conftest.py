"""Fixtures every test folder shares. Helpers live in ``tests.support``.

Ray is imported only inside the Ray fixtures: without Ray installed, only the tests that ask
for ``ray_cluster`` are skipped.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollgym.control_token import ENV_TOKEN, ENV_TOKEN_FILE
from rollgym.testing import serve_server
from tests.support.background import in_thread
from tests.support.servers import FaultyModel, refused_url

RAY_NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}

# Server processes never search the working directory (``python -P``): the test servers they
# start (``impl: tests.support.servers:FaultyModel``) are found on PYTHONPATH, as a user's
# installed-elsewhere package would be. Set before any Ray node starts, so its workers have it.
_REPO = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH")) if p)

# The control token that guards model servers' weight pushes, pauses and resumes
# (``rollgym.control_token``): one file per test session, in a directory of its own, inherited
# by every server process and Ray worker the tests start, never the user's own.
_TOKEN_DIR = tempfile.mkdtemp(prefix="rollgym-test-token-")
atexit.register(shutil.rmtree, _TOKEN_DIR, True)
os.environ[ENV_TOKEN_FILE] = os.path.join(_TOKEN_DIR, "control-token")
os.environ.pop(ENV_TOKEN, None)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """Two Ray nodes on this machine, started once; the test process is the driver."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**RAY_NODE, "include_dashboard": False})
    cluster.add_node(**RAY_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        # Ray records the head's address here and a later ``ray.init()`` would try to join it.
        recorded = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "ray_current_cluster")
        with contextlib.suppress(OSError):
            if recorded.read_text().strip() == cluster.address:
                recorded.unlink()


@pytest.fixture(scope="session")
def node_ids(ray_cluster: Any) -> set[str]:
    """The IDs of the cluster's live nodes."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.fixture(scope="session")
def down_model() -> Iterator[str]:
    """The URL of a model that answers 503 to every call, served on a thread of this process
    so that it answers while the test blocks (in ``ray.get``, a sync call, a child process)."""
    options = {"fail_status": 503, "down_for": 3600.0}
    with in_thread(serve_server(FaultyModel, name="model", options=options)) as (url, _):
        yield url


@pytest.fixture
def dead_url() -> Iterator[Callable[[], str]]:
    """Makes loopback URLs where nothing listens, each on its own port that this test holds
    until it ends, so that no other process can take it and answer (``refused_url``)."""
    with contextlib.ExitStack() as held:
        yield lambda: held.enter_context(refused_url())
