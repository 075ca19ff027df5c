"""The dialects every entry point hands the core: the protocols rollgym speaks beside its own.

Each is a folder implementing the core's small seams; this list is the one place that names
them. Adding a protocol is its folder plus one line here. Only entry points import this module
(the CLI, the server process ``rollgym.cli.worker``, ``rollgym.testing``).
"""

from __future__ import annotations

from rollgym.audit.target import AuditDialect
from rollgym.collect.dialect import RowDialect
from rollgym.nemo_gym.agent import AGENT_DIALECT as NEMO_GYM_07_AGENT
from rollgym.nemo_gym.resources_sessions import RESOURCES_DIALECT as NEMO_GYM_07_RESOURCES
from rollgym.nemo_gym.rows import ROWS as NEMO_GYM_07_ROWS
from rollgym.openenv.audit import openenv_player
from rollgym.server.agent import AgentDialect
from rollgym.server.resources import ResourcesDialect

ROW_DIALECTS: tuple[RowDialect, ...] = (
    NEMO_GYM_07_ROWS,  # materialized rows: episodes, task ids, its failure fields
)
"""What the collector speaks beside the flat row (the CLI, the Ray collect workers and the
trainer API pass it down; a library caller who builds a ``RolloutRunner`` or a run by hand
speaks the flat row unless it passes one)."""

SERVER_DIALECTS: tuple[AgentDialect | ResourcesDialect, ...] = (
    NEMO_GYM_07_AGENT,  # episodes on /run, agent sessions
    NEMO_GYM_07_RESOURCES,  # named sessions: 0.7's /seed_session body, /close_session
)
"""What servers speak beside rollgym's own protocol (``ServerContext.dialects``): each kind of
server takes the entries of its own seam (an agent ``AgentDialect``s, a resources or
Gymnasium-style server ``ResourcesDialect``s)."""

AUDIT_DIALECTS: tuple[AuditDialect, ...] = (
    openenv_player,  # an OpenEnv server (its GET /schema): episodes over its /ws session
)
"""How ``rollgym audit`` plays an environment that does not speak rollgym's HTTP shape: each
entry is asked first, and the first that recognizes the server plays it."""

__all__ = ["AUDIT_DIALECTS", "ROW_DIALECTS", "SERVER_DIALECTS"]
