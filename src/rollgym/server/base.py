"""What every rollgym server is: a name, its config, the other servers it may call."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, ValidationError

from rollgym.config import Config, ServerConfig, format_validation_error
from rollgym.errors import ConfigError
from rollgym.http import HttpClient, Target

# Short names usable as ``impl:`` in a config.
BUILTIN_IMPLS: dict[str, str] = {
    "scripted": "rollgym.models.scripted:ScriptedModel",
    "openai_proxy": "rollgym.models.proxy:OpenAIProxy",
    "tool_agent": "rollgym.agents.tool_agent:ToolAgent",
    "lookup": "rollgym.envs.lookup.server:LookupEnv",
    "mcqa": "rollgym.envs.mcqa.server:MCQAEnv",
    "math": "rollgym.envs.math.server:MathEnv",
    "echo": "rollgym.envs.echo.server:EchoEnv",
}


@dataclass
class ServerContext:
    """What a server knows when it starts: who it is and where every other server is."""

    name: str
    config: ServerConfig
    peers: dict[str, Target] = field(default_factory=dict)

    @classmethod
    def from_run(cls, name: str, config: Config, urls: dict[str, list[str]]) -> ServerContext:
        peers = {
            peer: Target(peer, tuple(u.rstrip("/") for u in urls[peer]), cfg.retry)
            for peer, cfg in config.servers.items()
            if peer in urls
        }
        return cls(name=name, config=config.servers[name], peers=peers)


class BaseServer:
    """Base of the three server kinds. Subclasses add routes; transport lives elsewhere."""

    kind: ClassVar[str] = "server"
    Options: ClassVar[type[BaseModel] | None] = None
    """A pydantic model of the ``options:`` this server takes (unknown keys refused), checked
    before any server starts; None takes any options unchecked."""

    @classmethod
    def check_options(cls, config: Config, name: str) -> None:
        """Validate server ``name``'s options in ``config``; raise ``ConfigError`` naming the
        file and key. Called before any server starts."""
        if cls.Options is None:
            return
        try:
            cls.Options.model_validate(config.servers[name].options)
        except ValidationError as exc:
            source = config.source or "config"
            prefix = f"servers.{name}.options"
            raise ConfigError(format_validation_error(source, exc, prefix=prefix)) from None

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.name = ctx.name
        self.options: dict[str, Any] = dict(ctx.config.options)
        self.client = HttpClient()

    def add_routes(self, app: FastAPI) -> None:
        """Register this server's endpoints on ``app``."""

    def features(self) -> list[str]:
        """Optional endpoints this server really implements (reported by ``/health``)."""
        return []

    async def startup(self) -> None:
        """Called once before the first request."""

    async def shutdown(self) -> None:
        await self.client.close()

    def peer(self, name: str) -> Target:
        try:
            return self.ctx.peers[name]
        except KeyError:
            raise ConfigError(
                f"server {self.name!r} needs server {name!r}, which is not in the run"
            ) from None

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)


class NoOptions(BaseModel):
    """For servers that take no options: any key is a mistake."""

    model_config = ConfigDict(extra="forbid")


def check_servers(config: Config) -> None:
    """Before anything starts: every server's impl resolves and its options (peers included)
    are valid; raise ``ConfigError`` naming the file and key."""
    for name, server in config.servers.items():
        resolve_impl(server.impl, server.kind).check_options(config, name)


def resolve_impl(impl: str, kind: str | None = None) -> type[BaseServer]:
    """The server class named by ``impl`` (a short name or ``package.module:Class``)."""
    path = BUILTIN_IMPLS.get(impl, impl)
    module_name, _, attr = path.partition(":")
    if not attr:
        raise ConfigError(
            f"impl {impl!r} is neither a built-in ({', '.join(BUILTIN_IMPLS)}) "
            "nor of the form 'package.module:Class'"
        )
    try:
        module = importlib.import_module(module_name)
        klass = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"impl {impl!r}: cannot load {path}: {exc}") from None
    if not (isinstance(klass, type) and issubclass(klass, BaseServer)):
        raise ConfigError(f"impl {impl!r}: {path} is not a rollgym server class")
    if kind is not None and klass.kind != kind:
        raise ConfigError(f"impl {impl!r} is a {klass.kind} server, not a {kind} server")
    return klass
