"""Container tests of Harbor tasks: real podman, images built once per session (and cached by
digest across sessions), every bundled task prepared once."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rollgym.containers.podman import PodmanRuntime

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "harbor-tasks"
RUN = "rollgym-test-harbor"


def _busybox() -> bool:
    from rollgym.harbor.trial import BUSYBOX_PATHS

    return any(os.access(p, os.X_OK) for p in BUSYBOX_PATHS)


needs_podman = pytest.mark.skipif(
    not PodmanRuntime.available() or not _busybox(),
    reason="PODMAN OR BUSYBOX-STATIC IS NOT INSTALLED: the Harbor container tests need podman "
    "with runc, and a static busybox for the verifier's harness (.ci/run and the README's test "
    "command install them: scripts/install_containers.sh)",
)


@pytest.fixture(scope="session")
def prepared() -> dict[str, object]:
    """Every bundled task's prepared image (built, git history cut, tools fingerprinted)."""
    from rollgym.containers.lease import new_lease
    from rollgym.harbor.image import prepare
    from rollgym.harbor.task import load_tasks

    async def all_tasks() -> dict[str, object]:
        runtime = PodmanRuntime()
        lease = new_lease(RUN, 3600)
        tasks = load_tasks(BUNDLED)
        done = await asyncio.gather(*(prepare(t, runtime, lease) for t in tasks))
        return {p.task.name: p for p in done}

    return asyncio.run(all_tasks())
