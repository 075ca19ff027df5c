"""Fixtures of the container tests: real podman (runc), one base image per machine (built once
by ``ensure_base``, cached by its recipe's digest), and a run name per test whose containers and
images are removed by label at its end (never anything this test did not make)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest

from rollgym.containers import lease as leases
from rollgym.containers.podman import PodmanRuntime
from rollgym.containers.runtime import Lease, Limits, Spec

if not PodmanRuntime.available():
    pytest.skip(
        "podman is not installed: the container tests need it "
        "(scripts/install_containers.sh installs podman, runc and mmdebstrap)",
        allow_module_level=True,
    )


def remove_run(run: str) -> None:
    """Remove the containers, then the images, labelled with ``run`` (this test's only)."""
    label = f"label={leases.RUN}={run}"
    ids = subprocess.run(
        ["podman", "ps", "-aq", "--filter", label], capture_output=True, text=True, timeout=60
    ).stdout.split()
    if ids:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True, timeout=120)
    images = subprocess.run(
        ["podman", "images", "-aq", "--filter", label], capture_output=True, text=True, timeout=60
    ).stdout.split()
    if images:
        subprocess.run(["podman", "rmi", "-f", *set(images)], capture_output=True, timeout=120)


def run_containers(run: str) -> list[str]:
    """Ids of the containers labelled with ``run``."""
    return subprocess.run(
        ["podman", "ps", "-aq", "--filter", f"label={leases.RUN}={run}"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()


@pytest.fixture(scope="session")
def base_image() -> str:
    if os.geteuid() != 0:
        pytest.skip("the container tests run rootful podman: run them as root")
    from rollgym.containers.images import ensure_base

    return ensure_base()


@pytest.fixture
def run_name() -> Iterator[str]:
    run = f"test-{secrets.token_hex(4)}"
    yield run
    remove_run(run)


@pytest.fixture
def lease(run_name: str) -> Lease:
    return leases.new_lease(run_name, 120)


@pytest.fixture
def runtime() -> PodmanRuntime:
    return PodmanRuntime()


@pytest.fixture
def spec(base_image: str, lease: Lease) -> Spec:
    return Spec(image=base_image, limits=Limits(memory_mb=256, pids=128), lease=lease)


@pytest.fixture
async def container(runtime: PodmanRuntime, spec: Spec) -> AsyncIterator[object]:
    box = await runtime.create(spec, timeout=60)
    yield box
    await box.destroy()
