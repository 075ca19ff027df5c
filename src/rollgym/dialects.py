"""The dialects every entry point hands the core: the protocols rollgym speaks beside its own.

Each is a folder implementing the core's small seams; this list is the one place that names
them. Adding a protocol is its folder plus one line here. Only entry points import this module
(the CLI, the server process ``rollgym.cli.worker``, ``rollgym.testing``).
"""

from __future__ import annotations

from rollgym.nemo_gym.agent import AGENT_DIALECT as NEMO_GYM_07_AGENT
from rollgym.server.agent import AgentDialect

AGENT_DIALECTS: tuple[AgentDialect, ...] = (
    NEMO_GYM_07_AGENT,  # episodes on /run, agent sessions
)
"""What an agent server speaks beside a flat task row on ``/run`` (``ServerContext.dialects``)."""

__all__ = ["AGENT_DIALECTS"]
