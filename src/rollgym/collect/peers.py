"""What the servers of a run say about each other, read from their typed options.

A server's ``options:`` are validated into its class's ``Options`` (``BaseServer.parse_options``);
every question the collector or ``reverify`` asks of them (which resources server an agent
verifies with, which servers a resources server calls) is answered from that validated model,
defaults included, never from the raw mapping: an agent that relies on the default
``resources: resources`` is the same agent under ``run`` and under ``reverify``.
"""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel

from rollgym.config import Config
from rollgym.errors import ConfigError
from rollgym.server.agent import AgentServer
from rollgym.server.base import ModelPeer, Peer, ResourcesPeer, resolve_impl

# The validators that mark an option as naming another server (``Peer`` and its kinds).
_PEER_MARKS = tuple(get_args(alias)[1] for alias in (Peer, ModelPeer, ResourcesPeer))


def typed_options(config: Config, name: str) -> BaseModel | None:
    """Server ``name``'s options as its class validates them (defaults filled in); None for a
    server given by ``url:`` only, whose class (if any) this run does not know."""
    server = config.servers[name]
    if server.impl is None:
        return None
    source = config.source or "config"
    klass = resolve_impl(
        server.impl, server.kind, config_dir=config.base_dir(),
        where=f"{source}: servers.{name}.impl",
    )  # fmt: skip
    return klass.parse_options(
        server.options, source=source, prefix=f"servers.{name}.options", servers=config.servers
    )


def resources_of(config: Config, agent: str) -> str:
    """The resources server that ``agent`` verifies with: its typed ``resources`` option. An
    agent given by ``url:`` only is taken to follow ``AgentServer``'s options (the raw option,
    else its default)."""
    options = typed_options(config, agent)
    if options is not None:
        name = getattr(options, "resources", None)
    else:
        default = AgentServer.Options.model_fields["resources"].default
        name = config.servers[agent].options.get("resources", default)
    if not isinstance(name, str) or name not in config.servers:
        raise ConfigError(
            f"{config.source or 'config'}: servers.{agent}.options.resources: no server {name!r}"
        )
    return name


def peers_of(config: Config, name: str) -> set[str]:
    """The servers that server ``name``'s options declare as peers (``Peer`` fields), and
    theirs in turn: what must run for ``name`` to work."""
    found: set[str] = set()
    todo = [name]
    while todo:
        options = typed_options(config, todo.pop())
        if options is None:
            continue
        for field, info in type(options).model_fields.items():
            if not any(mark in info.metadata for mark in _PEER_MARKS):
                continue
            value = getattr(options, field)
            for peer in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(peer, str) and peer in config.servers and peer not in found:
                    found.add(peer)
                    todo.append(peer)
    found.discard(name)
    return found
