"""What every rollgym server is: a name, its typed options, the other servers it may call."""

from __future__ import annotations

import difflib
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo
from starlette.routing import BaseRoute

from rollgym.config import Config, ServerConfig, ServerKind, format_validation_error
from rollgym.errors import ConfigError
from rollgym.extras import missing_hint
from rollgym.http import HttpClient, Target
from rollgym.server.provenance import LoadedCode

# Short names usable as ``impl:`` in a config.
BUILTIN_IMPLS: dict[str, str] = {
    "scripted": "rollgym.models.scripted:ScriptedModel",
    "openai_proxy": "rollgym.models.proxy:OpenAIProxy",
    "local_model": "rollgym.models.local:LocalModel",
    "tool_agent": "rollgym.agents.tool_agent:ToolAgent",
    "gymnasium_agent": "rollgym.agents.gymnasium:GymnasiumAgent",
    "openenv_agent": "rollgym.openenv.agent:OpenEnvAgent",
    "openenv": "rollgym.openenv.host:OpenEnvHost",
    "lookup": "rollgym.envs.lookup.server:LookupEnv",
    "mcqa": "rollgym.envs.mcqa.server:MCQAEnv",
    "math": "rollgym.envs.math.server:MathEnv",
    "echo": "rollgym.envs.echo.server:EchoEnv",
    "guess": "rollgym.envs.guess.server:GuessEnv",
    "code": "rollgym.envs.code.server:CodeEnv",
    "judge": "rollgym.envs.judge.server:JudgeEnv",
    "reasoning_gym": "rollgym.envs.reasoning_gym.server:ReasoningGymEnv",
    "stand_in_judge": "rollgym.envs.judge.stand_in:StandInJudge",
    "harbor": "rollgym.harbor.server:HarborEnv",
    "harbor_oracle": "rollgym.harbor.agents:OracleAgent",
    "harbor_nop": "rollgym.harbor.agents:NopAgent",
}


@dataclass
class ServerContext:
    """What a server knows when it starts: who it is and where every other server is."""

    name: str
    config: ServerConfig
    peers: dict[str, Target] = field(default_factory=dict)
    dialects: tuple[Any, ...] = ()
    """The dialects the process's entry point listed (``rollgym.dialects``): each kind of
    server takes those of its own seam (an agent: ``rollgym.server.agent.AgentDialect``)."""

    @classmethod
    def from_run(
        cls,
        name: str,
        config: Config,
        urls: dict[str, list[str]],
        dialects: tuple[Any, ...] = (),
    ) -> ServerContext:
        peers = {
            peer: Target(peer, tuple(u.rstrip("/") for u in urls[peer]), cfg.retry)
            for peer, cfg in config.servers.items()
            if peer in urls
        }
        return cls(name=name, config=config.servers[name], peers=peers, dialects=dialects)


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
    required_row_fields: ClassVar[frozenset[str]] = frozenset()
    """The fields among those it reads that every row must carry: the collector refuses a task
    file with a row without one before it dispatches anything (``/health``), instead of a
    failure per rollout at verify time."""

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
            raise ConfigError(
                format_validation_error(source, exc, prefix=prefix, model=cls.Options)
            ) from None

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.name = ctx.name
        self.options = type(self).parse_options(
            ctx.config.options, source=f"server {ctx.name!r}", prefix=f"servers.{ctx.name}.options"
        )
        self.client = HttpClient()
        # Read once, at start: the file this process imported, as it was then.
        self.code = LoadedCode.of(type(self), ctx.config.impl)

    def routes(self) -> list[BaseRoute]:
        """This server's endpoints (Starlette routes); exact-path POST routes take the fast
        path of ``rollgym.server.app.App``."""
        return []

    def features(self) -> list[str]:
        """Optional endpoints this server really implements (reported by ``/health``)."""
        return []

    def health(self) -> dict[str, Any]:
        """The ``/health`` answer: who this server is, what it offers and reads, and which
        code it runs (``code``: recorded in ``run.json``)."""
        fields = type(self).row_fields
        return {
            "status": "ok",
            "server": self.name,
            "kind": self.kind,
            "features": self.features(),
            "row_fields": None if fields is None else sorted(fields),
            "required_row_fields": sorted(type(self).required_row_fields),
            "code": self.code.to_dict(),
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
    are valid; raise ``ConfigError`` naming the file and key. A run's pre-flight: called once
    per run where its launcher is built (``rollgym.collect.launchers``), or by a
    ``Supervisor`` / ``RayServers`` built without ``checked=True`` when it starts."""
    source = config.source or "config"
    for name, server in config.servers.items():
        if server.impl is None:
            continue  # given by url only: runs elsewhere, maybe not a rollgym server at all
        klass = resolve_impl(
            server.impl,
            server.kind,
            config_dir=config.base_dir(),
            where=f"{source}: servers.{name}.impl",
        )
        klass.check_options(config, name)


def resolve_impl(
    impl: str | None,
    kind: str | None = None,
    *,
    config_dir: Path | None = None,
    where: str = "impl",
) -> type[BaseServer]:
    """The server class named by ``impl`` (a short name or ``module:Class``). A module is
    looked for among the installed packages, then in ``config_dir`` (the config's folder, so
    ``impl: weather:Weather`` finds the ``weather.py`` beside the config). ``where`` names the
    file and key in errors."""
    if impl is None:
        raise ConfigError(f"{where}: missing: a server rollgym starts needs one (impl: NAME)")
    path = BUILTIN_IMPLS.get(impl, impl)
    module_name, _, attr = path.partition(":")
    if not attr or not module_name:
        near = difflib.get_close_matches(impl, BUILTIN_IMPLS, n=1)
        hint = f"did you mean {near[0]}? Otherwise use " if near else "use "
        raise ConfigError(
            f"{where}: {impl!r} is not a built-in server ({', '.join(BUILTIN_IMPLS)}); "
            f"{hint}'module:Class' (e.g. weather:Weather for a weather.py beside the config)"
        )
    if config_dir is not None:
        folder = str(Path(config_dir).absolute())
        # Appended, not prepended: a file beside the config never shadows an installed
        # module (a config folder named like a package must not hide the package).
        if folder not in sys.path:
            sys.path.append(folder)
    module = _import(module_name, impl, where, config_dir)
    klass = getattr(module, attr, None)
    if klass is None:
        classes = sorted(n for n, v in vars(module).items() if _is_server(v))
        near = difflib.get_close_matches(attr, classes, n=1)
        hint = (
            f"did you mean {near[0]}?"
            if near
            else (f"server classes in it: {', '.join(classes) or 'none'}")
        )
        raise ConfigError(
            f"{where}: {impl!r}: {getattr(module, '__file__', module_name)} has no {attr!r} "
            f"({hint})"
        )
    if not _is_server(klass):
        raise ConfigError(
            f"{where}: {impl!r}: {path} is not a rollgym server class (a subclass of "
            "ResourcesServer, ModelServer or AgentServer)"
        )
    if kind is not None and klass.kind != kind:
        raise ConfigError(f"{where}: {impl!r} is a {klass.kind} server, not a {kind} server")
    result: type[BaseServer] = klass
    return result


def _is_server(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseServer)


def _import(module_name: str, impl: str, where: str, config_dir: Path | None) -> Any:
    """Import the module of ``impl``; a ``ConfigError`` saying what to do if that fails."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name != missing and not module_name.startswith(missing + "."):
            raise ConfigError(
                f"{where}: {impl!r}: importing {module_name} failed: {exc} ({missing_hint(exc)})"
            ) from None
        top = module_name.split(".")[0]
        beside = f" ({Path(config_dir).absolute()})" if config_dir is not None else ""
        raise ConfigError(
            f"{where}: {impl!r}: no module named {missing!r} among the installed packages or "
            f"beside the config; put {top}.py (or the package {top}/) beside the config"
            f"{beside}, install it, or add its folder to PYTHONPATH"
        ) from None
    except Exception as exc:  # the user's module failed to import: say where, not a traceback
        raise ConfigError(
            f"{where}: {impl!r}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
