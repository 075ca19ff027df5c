"""A trial removes the snapshot its verifier started from: nothing of it is left at its end
(before this, one image per trial piled up until the run's lease ended)."""

from __future__ import annotations

import json
import secrets
import subprocess
from typing import Any

import pytest

from rollgym.containers.lease import RUN as RUN_LABEL
from rollgym.containers.lease import new_lease
from rollgym.containers.podman import PodmanRuntime
from rollgym.harbor.trial import Trial
from tests.harbor.conftest import needs_podman

pytestmark = [needs_podman, pytest.mark.timeout(300)]


def leased_to(run: str) -> list[str]:
    """Containers and images whose lease names ``run``."""
    found: list[str] = []
    for args in (["ps", "-a"], ["images", "-a"]):
        done = subprocess.run(
            ["podman", *args, "--filter", f"label={RUN_LABEL}={run}", "--format", "json"],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        found += [row["Id"] for row in json.loads(done.stdout or b"[]") or []]
    return found


async def test_a_trial_leaves_no_snapshot_image_behind(prepared: dict[str, Any]) -> None:
    run = f"rollgym-test-trial-{secrets.token_hex(4)}"
    trial = Trial(prepared["hello-file"], PodmanRuntime(), new_lease(run, 600))
    box = await trial.start()
    await box.exec("printf 'Hello, rollgym!\\n' > /app/hello.txt", timeout=30)
    verdict = await trial.verify()
    await trial.close()
    assert verdict.rewards.reward == 1.0
    assert leased_to(run) == []
