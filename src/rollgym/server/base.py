"""What every rollgym server is: a name, its typed options, the other servers it may call."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo
from starlette.routing import BaseRoute

from rollgym.config import Config, ServerConfig, ServerKind, format_validation_error
from rollgym.errors import ConfigError
from rollgym.http import HttpClient, Target

# Short names usable as ``impl:`` in a config.
BUILTIN_IMPLS: dict[str, str] = {
    "scripted": "rollgym.models.scripted:ScriptedModel",
    "openai_proxy": "rollgym.models.proxy:OpenAIProxy",
    "tool_agent": "rollgym.agents.tool_agent:ToolAgent",
    "gymnasium_agent": "rollgym.agents.gymnasium:GymnasiumAgent",
    "lookup": "rollgym.envs.lookup.server:LookupEnv",
    "mcqa": "rollgym.envs.mcqa.server:MCQAEnv",
    "math": "rollgym.envs.math.server:MathEnv",
    "echo": "rollgym.envs.echo.server:EchoEnv",
    "guess": "rollgym.envs.guess.server:GuessEnv",
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


def _peer_of(kind: ServerKind | None) -> AfterValidator:
    def check(name: str, info: ValidationInfo) -> str:
        # Checked where the whole config is known (``check_options``); a running server
        # finds its peers' addresses in its context instead.
        servers: dict[str, ServerConfig] | None = (info.context or {}).get("servers")
        if servers is None:
            return name
        if name not in servers:
            raise ValueError(f"no server named {name!r} (known: {', '.join(sorted(servers))})")
        if kind is not None and servers[name].kind != kind:
            raise ValueError(f"server {name!r} is a {servers[name].kind} server, not a {kind} one")
        return name

    return AfterValidator(check)


Peer = Annotated[str, _peer_of(None)]
"""An option naming another server of the run; checked against the config before start."""
ModelPeer = Annotated[str, _peer_of("model")]
ResourcesPeer = Annotated[str, _peer_of("resources")]


class BaseServer:
    """Base of the three server kinds. Subclasses declare ``Options`` and add routes;
    transport lives elsewhere."""

    kind: ClassVar[str] = "server"
    row_fields: ClassVar[frozenset[str] | None] = None
    """The top-level task-row fields this server reads, besides rollgym's own
    (``responses_create_params``, ``agent_ref``, the indices); ``None``: not declared. Reported
    by ``/health``: the collector warns once per run about row fields that no server reads."""

    class Options(BaseModel):
        """The ``options:`` a server takes, validated once into ``self.options``. A subclass
        extends it (``class Options(Base.Options)``) and says ``options: Options``; unknown
        keys are refused, and ``Peer`` fields (defaults too) must name servers of the run."""

        model_config = ConfigDict(extra="forbid", validate_default=True)

    options: BaseModel

    @classmethod
    def check_options(cls, config: Config, name: str) -> None:
        """Validate server ``name``'s options in ``config`` (peers included); raise
        ``ConfigError`` naming the file and key. Called before any server starts."""
        cls.parse_options(
            config.servers[name].options,
            source=config.source or "config",
            prefix=f"servers.{name}.options",
            servers=config.servers,
        )

    @classmethod
    def parse_options(
        cls,
        raw: dict[str, Any],
        *,
        source: str,
        prefix: str,
        servers: dict[str, ServerConfig] | None = None,
    ) -> BaseModel:
        """``raw`` as this server's ``Options``; ``ConfigError`` naming each bad key."""
        try:
            return cls.Options.model_validate(raw, context={"servers": servers})
        except ValidationError as exc:
            raise ConfigError(format_validation_error(source, exc, prefix=prefix)) from None

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.name = ctx.name
        self.options = type(self).parse_options(
            ctx.config.options, source=f"server {ctx.name!r}", prefix=f"servers.{ctx.name}.options"
        )
        self.client = HttpClient()

    def routes(self) -> list[BaseRoute]:
        """This server's endpoints (Starlette routes); exact-path POST routes take the fast
        path of ``rollgym.server.app.App``."""
        return []

    def features(self) -> list[str]:
        """Optional endpoints this server really implements (reported by ``/health``)."""
        return []

    def health(self) -> dict[str, Any]:
        """The ``/health`` answer: who this server is and what it offers and reads."""
        fields = type(self).row_fields
        return {
            "status": "ok",
            "server": self.name,
            "kind": self.kind,
            "features": self.features(),
            "row_fields": None if fields is None else sorted(fields),
        }

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


NoOptions = BaseServer.Options
"""For servers that take no options: any key is a mistake."""


def check_servers(config: Config) -> None:
    """Before anything starts: every server's impl resolves and its options (peers included)
    are valid; raise ``ConfigError`` naming the file and key."""
    for name, server in config.servers.items():
        if server.impl is None:
            continue  # given by url only: runs elsewhere, maybe not a rollgym server at all
        resolve_impl(server.impl, server.kind).check_options(config, name)


def resolve_impl(impl: str | None, kind: str | None = None) -> type[BaseServer]:
    """The server class named by ``impl`` (a short name or ``package.module:Class``)."""
    if impl is None:
        raise ConfigError("no impl: a server rollgym starts needs one (impl: NAME)")
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
