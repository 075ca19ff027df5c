"""Images without a registry.

No registry is reachable from where rollgym runs its tests, but Debian's archive is. So:

- **A base image** is built once by ``mmdebstrap`` from Debian's archive and ``podman import``ed.
  Its tag is the digest of its recipe (suite, variant, packages, mirror), so a changed recipe is
  a new image and an unchanged one is never built twice: ``ensure_base()``. It holds python3,
  pytest, git, bash and coreutils, so most task images need no ``apt-get`` at all.
- **FROM names** that task Dockerfiles use are mapped to local builds (``FROM_MAP``); where the
  mapping is not exact (``python:3.12`` is Debian bookworm's Python 3.11) a warning says so.
- **Task images** are cached by the digest of the Dockerfile and its build context:
  ``build_task_image()`` rewrites ``FROM`` to the local image, runs ``podman build`` and tags
  ``localhost/rollgym-task:<digest>``. A Dockerfile that cannot be built here (an unknown
  ``FROM``, a ``RUN`` that fails, a build past its deadline) is an ``ImageBuildError`` naming
  the Dockerfile and its line, never a hang.

Two processes building the same digest take a lock file (``fcntl.flock``) in turn: the second
finds the image made by the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from rollgym.errors import ContainerError, ImageBuildError

log = logging.getLogger(__name__)

BASE_REPO = "localhost/rollgym-base"
TASK_REPO = "localhost/rollgym-task"
CACHE_LABEL = "rollgym.cache"
"""Label on images built here (``base`` or ``task``): a cache, never leased or reaped."""
BASE_TIMEOUT = 900.0
"""Seconds allowed to build the base image (mmdebstrap typically takes 20-60 s)."""


@dataclass(frozen=True, slots=True)
class BaseRecipe:
    """What the base image is made of; its digest is the image's tag."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = (
        "python3", "python3-pytest", "python3-venv", "git", "bash", "coreutils", "procps",
        "ca-certificates", "patch", "diffutils", "findutils", "grep", "sed",
    )  # fmt: skip
    mirror: str = "http://deb.debian.org/debian"

    def digest(self) -> str:
        raw = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:16]

    @property
    def tag(self) -> str:
        return f"{BASE_REPO}:{self.digest()}"


BASE = BaseRecipe()


def lock_dir() -> Path:
    """Where build lock files live (shared by every process of this user on this host)."""
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollgym" / "locks"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def build_lock(key: str, *, timeout: float) -> Iterator[None]:
    """Hold the lock of ``key`` (one build of one digest at a time); wait at most ``timeout``
    seconds for another process's build, then fail typed."""
    path = lock_dir() / f"{key}.lock"
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ImageBuildError(
                        f"waited {timeout:.0f} s for another process's build of {key} "
                        f"(lock {path})",
                        server="podman",
                        endpoint="build",
                        retryable=True,
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _podman(*args: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            ["podman", "--runtime", "runc", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise ContainerError(
            f"podman {args[0]} took longer than {timeout:.0f} s",
            server="podman",
            endpoint=args[0],
            retryable=True,
        ) from exc
    if check and done.returncode != 0:
        raise ContainerError(
            f"podman {args[0]} failed (exit {done.returncode})",
            status=done.returncode,
            body=done.stderr[-4000:],
            server="podman",
            endpoint=args[0],
        )
    return done


def image_exists(ref: str) -> bool:
    """Whether ``ref`` is in local storage."""
    return _podman("image", "exists", ref, timeout=60, check=False).returncode == 0


def ensure_base(recipe: BaseRecipe = BASE, *, timeout: float = BASE_TIMEOUT) -> str:
    """The base image's tag, building it first if this host has none (once per recipe, under a
    lock). Needs root, ``mmdebstrap`` and Debian's archive."""
    tag = recipe.tag
    if image_exists(tag):
        return tag
    with build_lock(f"base-{recipe.digest()}", timeout=timeout):
        if image_exists(tag):  # built by another process while this one waited
            return tag
        if shutil.which("mmdebstrap") is None:
            raise ImageBuildError(
                "the base image needs mmdebstrap (scripts/install_containers.sh installs it)",
                server="podman",
                endpoint="build",
            )
        with tempfile.TemporaryDirectory(prefix="rollgym-base-") as tmp:
            tar = Path(tmp) / "rootfs.tar"
            started = time.monotonic()
            try:
                argv = [
                    "mmdebstrap", "--quiet", f"--variant={recipe.variant}",
                    f"--include={','.join(recipe.packages)}", recipe.suite, str(tar), recipe.mirror,
                ]  # fmt: skip
                done = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired as exc:
                raise ImageBuildError(
                    f"mmdebstrap of {recipe.suite} took longer than {timeout:.0f} s",
                    server="podman",
                    endpoint="build",
                    retryable=True,
                ) from exc
            if done.returncode != 0:
                raise ImageBuildError(
                    f"mmdebstrap of {recipe.suite} failed (exit {done.returncode}): is "
                    f"{recipe.mirror} reachable?",
                    status=done.returncode,
                    body=done.stderr[-4000:],
                    server="podman",
                    endpoint="build",
                )
            _podman(
                "import",
                "--change", 'CMD ["/bin/bash"]',
                "--change", "ENV LANG=C.UTF-8",
                "--change", f"LABEL {CACHE_LABEL}=base",
                "--change", f"LABEL rollgym.recipe={recipe.digest()}",
                str(tar), tag,
                timeout=600,
            )  # fmt: skip
            log.info("built %s in %.0f s", tag, time.monotonic() - started)
    return tag
