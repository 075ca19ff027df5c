"""How a server process is told its spec: on a descriptor of an unnamed file, read once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollgym.config import parse_config
from rollgym.launch import ProcessGroup, ServerSpec

pytestmark = pytest.mark.timeout(60)


def what_it_shows(pid: int) -> tuple[list[bytes], list[str], bytes]:
    """``pid``'s command line, what its descriptors point at, its environment."""
    proc = Path(f"/proc/{pid}")
    held = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
    return (proc / "cmdline").read_bytes().split(b"\0"), held, (proc / "environ").read_bytes()


async def test_a_spec_larger_than_a_pipe_buffer_reaches_the_server(tmp_path: Path) -> None:
    # 1 MiB of another server's options: no pipe to fill, no writer to block.
    blob = "x" * (1 << 20)
    cfg = parse_config(
        {
            "servers": {
                "env": {"kind": "resources", "impl": "echo"},
                "far": {"kind": "resources", "url": "http://127.0.0.1:9", "options": {"b": blob}},
            }
        },
        "spec-test",
    )
    group = ProcessGroup(cfg.model_dump(mode="json"), log_dir=tmp_path)
    try:
        await group.start([ServerSpec("env")], {"far": ["http://127.0.0.1:9"]}, timeout=30)
        (pid,) = group.pids()
        cmdline, held, environ = what_it_shows(pid)
        assert b"--spec-fd" in cmdline
        assert not any("rollgym-worker-spec" in target or "rollgym-spec" in target
                       for target in held)  # fmt: skip
        assert b"ROLLGYM_WORKER" not in environ and blob.encode() not in environ
    finally:
        await group.stop()


def test_a_worker_started_without_a_spec_says_how_to_start_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollgym.cli.worker"], capture_output=True, text=True,
        timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert "usage: python -m rollgym.cli.worker --spec-fd FD" in done.stderr
    assert "Traceback" not in done.stderr
