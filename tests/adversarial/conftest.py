"""Fixtures of the red-team tests: the environment tests' own client."""

from __future__ import annotations

from tests.envs.conftest import connect

__all__ = ["connect"]
