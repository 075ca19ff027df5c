"""The dialects every entry point hands the core: the protocols rollgym speaks beside its own.

Each is a folder implementing the core's small seams; this list is the one place that names
them. Adding a protocol is its folder plus one line here. Only entry points import this module
(the CLI, the server process ``rollgym.cli.worker``, ``rollgym.testing``).
"""

from __future__ import annotations

from rollgym.nemo_gym.agent import AGENT_DIALECT as NEMO_GYM_07_AGENT
from rollgym.nemo_gym.resources_sessions import RESOURCES_DIALECT as NEMO_GYM_07_RESOURCES
from rollgym.server.agent import AgentDialect
from rollgym.server.resources import ResourcesDialect

SERVER_DIALECTS: tuple[AgentDialect | ResourcesDialect, ...] = (
    NEMO_GYM_07_AGENT,  # episodes on /run, agent sessions
    NEMO_GYM_07_RESOURCES,  # named sessions: 0.7's /seed_session body, /close_session
)
"""What servers speak beside rollgym's own protocol (``ServerContext.dialects``): each kind of
server takes the entries of its own seam (an agent ``AgentDialect``s, a resources or
Gymnasium-style server ``ResourcesDialect``s)."""

__all__ = ["SERVER_DIALECTS"]
