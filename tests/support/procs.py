"""Process checks shared by the launcher and CLI tests."""

from __future__ import annotations

import time

import psutil


def still_alive(pids: list[int], timeout: float = 8.0) -> list[int]:
    """The pids still running after up to ``timeout`` seconds (zombies count as gone: a reparented
    child may wait for a reaper that a container does not have)."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
