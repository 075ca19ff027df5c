"""The watchdog never fails silently: a restart that raises anything (no file descriptors left,
no fork) ends the run with that reason, and dispatch is never left paused."""

from __future__ import annotations

from typing import Any

import pytest

from rollgym.launch.watch import RestartPolicy, Watchdog

pytestmark = pytest.mark.timeout(30)


class _Server:
    def describe(self) -> str:
        return "replica 0, pid 1, http://127.0.0.1:1"

    def log_tail(self) -> str:
        return ""


class _Group:
    """A group whose env replica is dead and cannot be spawned again."""

    def __init__(self) -> None:
        self.restarts = 0

    def poll(self) -> dict[str, int]:
        return {"env.0": -9}

    def find(self, name: str, replica: int) -> Any:
        return _Server()

    async def restart(self, name: str, replica: int, timeout: float) -> None:
        self.restarts += 1
        raise OSError(24, "Too many open files")


async def test_a_restart_that_raises_is_a_fatal_reason_not_a_silent_stop() -> None:
    group = _Group()
    watchdog = Watchdog(group, 5.0, RestartPolicy(backoff=(0.0,)))  # type: ignore[arg-type]
    fatal: list[str] = []
    paused: list[bool] = []
    await watchdog.run(fatal.append, paused.append)
    assert group.restarts == 1
    assert len(fatal) == 1
    assert "server env exited with code -9 and could not be restarted" in fatal[0]
    assert "Too many open files" in fatal[0]
    assert paused == [True, False]  # dispatch resumed: the run can abort cleanly
