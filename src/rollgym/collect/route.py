"""Which server runs a task row: the run's routes (``collect.agent``, ``agent_aliases``,
``taskset_routes``, ``--agent``), asked by a row's dialect (``collect.dialect``) with what the
row names: an agent (``agent_ref``) or a taskset."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollgym.config import CollectConfig, Config

BY_AGENT = "agent_ref"
"""A row routed by the agent it names (``agent_ref.name``; none: the run's default)."""
BY_TASKSET = "taskset"
"""A row routed by its taskset (``collect.taskset_routes``)."""


@dataclass(frozen=True)
class AgentRoute:
    """Which server runs a row. ``agents`` are every server a row can go to: the agent servers
    and the environment servers (``environments``). A flat row: with
    ``override``, ``default`` runs every row; else the row's ``agent_ref.name``, a server of the
    config or a foreign name (``mcqa_simple_agent``...) that ``aliases`` maps to one;
    a row naming none goes to ``default``. A materialized row: ``default`` with ``override``,
    else ``tasksets[taskset]``, else the config's only agent or environment server."""

    agents: frozenset[str]
    default: str | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    override: bool = False
    tasksets: Mapping[str, str] = field(default_factory=dict)
    environments: frozenset[str] = frozenset()

    @classmethod
    def of(cls, config: Config, collect: CollectConfig, default: str | None = None) -> AgentRoute:
        """The route of a run of ``config`` (``default``: the run's agent, else
        ``Config.default_dispatcher``)."""
        agents = frozenset(config.dispatchers())
        if default is None:
            default = config.default_dispatcher(collect.agent)
        environments = frozenset(n for n in agents if config.servers[n].kind == "environment")
        return cls(
            agents, default, dict(collect.agent_aliases), collect.ignore_agent_ref,
            dict(collect.taskset_routes), environments,
        )  # fmt: skip

    def agent_for(self, name: Any) -> str | None:
        """The server for a flat row whose ``agent_ref.name`` is ``name``; ``None`` if no
        server of the run answers to it (or, naming none, there is no default)."""
        if self.override or name is None:
            return self.default
        if name in self.agents:
            return str(name)
        return self.aliases.get(name) if isinstance(name, str) else None

    def server_for_taskset(self, taskset: str) -> str | None:
        """The server for a materialized row of ``taskset``; ``None`` if none is routed."""
        if self.override:
            return self.default
        if taskset in self.tasksets:
            return self.tasksets[taskset]
        return next(iter(self.agents)) if len(self.agents) == 1 else None

    def server(self, by: str, name: Any) -> str | None:
        """The server for a row routed ``by`` its agent or its taskset ``name``."""
        return self.server_for_taskset(name) if by == BY_TASKSET else self.agent_for(name)

    def refusal(self, name: Any) -> str:
        """Why a row naming ``name`` cannot run, and the ways out."""
        known = ", ".join(sorted(self.agents)) or "none"
        target = self.default or "AGENT"
        return (
            f"agent_ref.name {name!r} is not an agent of the config (agents: {known}); "
            f"run every row with --agent {target}, or map the name in the config: "
            f"collect.agent_aliases: {{{name}: {target}}}"
        )

    def no_default(self) -> str:
        """Why a flat row naming no agent cannot run, and the ways out."""
        if not self.agents:
            return (
                "the row names no agent (agent_ref), and the config has no agent or environment "
                "server to run it: add one under servers (kind: agent or environment)"
            )
        known = ", ".join(sorted(self.agents))
        return (
            f"the row names no agent (agent_ref), and the config has several agent and "
            f"environment servers ({known}): name the one for such rows with collect.agent, "
            "or run every row with --agent NAME"
        )

    def taskset_refusal(self, taskset: str) -> str:
        """Why a materialized row of ``taskset`` cannot run, and the ways out."""
        if not self.agents:
            return (
                "the row names no agent (agent_ref), and the config has no agent or environment "
                "server to run it: add one under servers (kind: agent or environment)"
            )
        known = ", ".join(sorted(self.agents))
        return (
            f"no server runs taskset {taskset!r} (agent and environment servers: {known}); "
            f"route it in the config: collect.taskset_routes: {{{taskset!r}: SERVER}}, or run "
            "every row with --agent SERVER"
        )
