"""OpenEnv's own example environment for the tests: the echo environment that ``openenv init``
(openenv-core 0.3.0's CLI) writes from the template shipped in the package, made once per test
session offline into a temp dir and imported from there (``echo_env``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="needs openenv-core (the dev extra)")


@pytest.fixture(scope="session")
def echo_env_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("openenv")
    done = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(root)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (root / "echo_env" / "server" / "app.py").exists(), done.stdout + done.stderr
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root
