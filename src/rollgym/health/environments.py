"""Which environment a record belongs to, read from the record and the run's ``run.json``.

A record keeps its row's fields, so a row's ``agent_ref.name`` names the server that ran it
(through ``collect.agent_aliases``; none, or ``collect.ignore_agent_ref``: the run's agent). The
environment is the resources server that agent verifies with (its ``resources`` option, default
``resources``), as the collector names it in ``metrics.json``'s ``by_environment``; an
environment server stands for itself. Only the recorded config's plain values are read: a run
directory is input, and nothing in it is imported.

Names are those of the config's servers, so the set of labels is bounded by the config; a
record the config cannot place is ``unknown`` (no ``run.json``: every record is the run's).
"""

from __future__ import annotations

from typing import Any

RUN = "run"
"""The one environment of a run without a readable ``run.json``."""
UNKNOWN = "unknown"
_DEFAULT_RESOURCES = "resources"  # AgentServer.Options.resources's default


class Environments:
    """The environment of each record of one run."""

    def __init__(self, run_json: dict[str, Any]) -> None:
        config = run_json.get("config")
        servers = config.get("servers") if isinstance(config, dict) else None
        self._servers: dict[str, Any] = servers if isinstance(servers, dict) else {}
        collect = run_json.get("collect")
        collect = collect if isinstance(collect, dict) else {}
        aliases = collect.get("agent_aliases")
        self._aliases = aliases if isinstance(aliases, dict) else {}
        self._ignore_ref = collect.get("ignore_agent_ref") is True
        self._default = self._default_dispatcher(collect.get("agent"))
        self._placed: dict[str, str] = {}

    def _kind(self, name: str) -> Any:
        server = self._servers.get(name)
        return server.get("kind") if isinstance(server, dict) else None

    def _default_dispatcher(self, named: Any) -> str | None:
        # As Config.default_dispatcher: the named one, else the only agent or environment.
        if isinstance(named, str) and self._kind(named) in ("agent", "environment"):
            return named
        runners = [n for n in self._servers if self._kind(n) in ("agent", "environment")]
        if len(runners) == 1:
            return runners[0]
        agents = [n for n in runners if self._kind(n) == "agent"]
        return agents[0] if len(agents) == 1 else None

    def of(self, record: dict[str, Any]) -> str:
        """The environment of ``record`` (a server name of the config, ``run`` or ``unknown``)."""
        if not self._servers:
            return RUN
        server = self._default
        ref = record.get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) and not self._ignore_ref else None
        if isinstance(name, str):
            name = self._aliases.get(name, name)
            if isinstance(name, str) and self._kind(name) in ("agent", "environment"):
                server = name
        if server is None:
            return UNKNOWN
        placed = self._placed.get(server)  # one entry per server of the config: bounded
        if placed is None:
            placed = self._placed[server] = self._resources(server)
        return placed

    def _resources(self, server: str) -> str:
        if self._kind(server) != "agent":
            return server
        options = self._servers[server].get("options")
        name = options.get("resources") if isinstance(options, dict) else None
        name = _DEFAULT_RESOURCES if name is None else name
        return name if isinstance(name, str) and name in self._servers else server
