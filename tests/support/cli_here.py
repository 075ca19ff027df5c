"""The ``rollgym`` command run in the test's own process, and a count of the servers' pre-flight
checks (``check_servers`` checks each server's options once) made meanwhile. In this process:
the collector's, where the pre-flight runs; the servers are processes of their own."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rollgym import runtime
from rollgym.config import Config
from rollgym.server.base import BaseServer


def count_checks(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """From now on (until ``monkeypatch`` undoes it): how often each server's options were
    checked, by server name."""
    counted: Counter[str] = Counter()
    check = BaseServer.check_options.__func__  # type: ignore[attr-defined]

    def counting(cls: type[BaseServer], config: Config, name: str) -> None:
        counted[name] += 1
        check(cls, config, name)

    monkeypatch.setattr(BaseServer, "check_options", classmethod(counting))
    # The CLI tunes the garbage collector of the process it owns: not of this test session.
    monkeypatch.setattr(runtime, "tune_gc", lambda: None)
    return counted


def rollgym_here(*args: str | Path) -> int:
    """Run the ``rollgym`` command in this process; its exit code. A ``RollgymError``
    propagates (``main`` would print it and exit 2)."""
    from rollgym.cli.main import _register, app

    if not app.registered_commands:
        _register()
    try:
        app([str(a) for a in args], prog_name="rollgym")
    except SystemExit as done:
        return int(done.code or 0)
    raise AssertionError("rollgym did not exit")
