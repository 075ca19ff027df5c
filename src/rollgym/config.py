"""YAML config -> validated models. Every mistake names the file and the key.

A config names the servers of a run and how to collect::

    servers:
      model:     {kind: model, impl: scripted}
      lookup:    {kind: resources, impl: lookup}
      agent:     {kind: agent, impl: tool_agent, options: {model: model, resources: lookup}}
    collect:
      input: data/example.jsonl
      concurrency: 64

Each server carries its own retry policy; the defaults depend on its kind (see ``kind_defaults``).
"""

from __future__ import annotations

import copy
import datetime
import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from rollgym.errors import ConfigError, redact_url

ServerKind = Literal["model", "resources", "agent", "environment"]
DISPATCH_KINDS: tuple[ServerKind, ...] = ("agent", "environment")
"""The kinds of server the collector sends task rows to (``/run``): agents, and environment
servers (NeMo Gym 0.7's Environment Server kind)."""
SERVER_NAME_MAX = 64
_SERVER_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_.-]{{0,{SERVER_NAME_MAX - 1}}}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_MIB = 1 << 20
_KIB = 1 << 10


# -- a called server's retry policy (``retry:``); its rules are ``rollgym.http.policy``'s ------

MAX_ATTEMPTS_CAP = 10


class EndpointPolicy(_Strict):
    """Overrides of a server's retry policy for one endpoint (e.g. ``/verify``)."""

    idempotent: bool | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS_CAP)
    attempt_timeout: float | None = Field(default=None, gt=0)


class RetryBudgetConfig(_Strict):
    """Retries may not exceed ``ratio`` of recent requests plus ``min_retries_per_window``."""

    enabled: bool = True
    ratio: float = Field(default=0.2, ge=0, le=10)
    min_retries_per_window: int = Field(default=10, ge=0)
    window: float = Field(default=10.0, gt=0)


class BreakerConfig(_Strict):
    """Open after ``consecutive_failures`` final failures in a row, or a failure rate of at
    least ``failure_rate`` over ``window`` seconds with ``min_requests``; probe after ``cooldown``."""

    enabled: bool = True
    consecutive_failures: int = Field(default=50, ge=1)
    failure_rate: float = Field(default=0.9, gt=0, le=1)
    min_requests: int = Field(default=50, ge=1)
    window: float = Field(default=30.0, gt=0)
    cooldown: float = Field(default=5.0, gt=0)


class AnswerLimits(_Strict):
    """The most a caller reads of one answer of this server (``retry.answer_limits``). Past
    any of them the call fails with ``AnswerTooLarge`` and nothing more is read: a hostile or
    broken server (a gzip bomb, a body that never ends) costs its caller at most this much."""

    body_bytes: int = Field(default=64 * _MIB, ge=1, description="body as sent (compressed)")
    decompressed_bytes: int = Field(default=64 * _MIB, ge=1, description="body once decoded")
    header_bytes: int = Field(default=64 * _KIB, ge=1, description="all header lines together")
    headers: int = Field(default=100, ge=1, description="header lines")


class RetryPolicy(_Strict):
    """How calls to one server are made and retried. Attempts, total time and the size of an
    answer (``answer_limits``) are always bounded."""

    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS_CAP)
    backoff_initial: float = Field(default=0.1, ge=0)
    backoff_multiplier: float = Field(default=2.0, ge=1)
    backoff_max: float = Field(default=5.0, ge=0)
    deadline: float = Field(default=900.0, gt=0, description="total seconds across attempts")
    connect_timeout: float = Field(default=5.0, gt=0)
    attempt_timeout: float = Field(default=600.0, gt=0)
    idempotent: bool = False
    retry_statuses: tuple[int, ...] = (502, 503, 504)
    retry_4xx: tuple[int, ...] = ()
    retry_after_cap: float = Field(default=30.0, ge=0)
    endpoints: dict[str, EndpointPolicy] = Field(default_factory=dict)
    budget: RetryBudgetConfig = RetryBudgetConfig()
    breaker: BreakerConfig = BreakerConfig()
    # Here, not under ``limits:``: like the timeouts, they bound what callers of this server
    # accept, and travel with its policy to every caller (a proxy's ``upstream_retry`` too).
    answer_limits: AnswerLimits = AnswerLimits()

    @field_validator("retry_statuses")
    @classmethod
    def _only_5xx(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in value if not 500 <= s <= 599]
        if bad:
            raise ValueError(f"only 5xx statuses belong here, not {bad} (408/429: use retry_4xx)")
        return value

    @field_validator("retry_4xx")
    @classmethod
    def _only_408_429(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in value if s not in (408, 429)]
        if bad:
            raise ValueError(f"only 408 and 429 may be retried among 4xx, not {bad}")
        return value

    @field_validator("endpoints")
    @classmethod
    def _slash(cls, value: dict[str, EndpointPolicy]) -> dict[str, EndpointPolicy]:
        for name in value:
            if not name.startswith("/"):
                raise ValueError(f"endpoint {name!r} must start with '/'")
        return value

    def for_endpoint(self, endpoint: str) -> tuple[bool, int, float]:
        """(idempotent, max_attempts, attempt_timeout) in force for ``endpoint``."""
        override = self.endpoints.get(endpoint)
        if override is None:
            return self.idempotent, self.max_attempts, self.attempt_timeout
        return (
            self.idempotent if override.idempotent is None else override.idempotent,
            self.max_attempts if override.max_attempts is None else override.max_attempts,
            self.attempt_timeout if override.attempt_timeout is None else override.attempt_timeout,
        )


class ServerLimits(_Strict):
    """The most a rollgym server takes in (``limits:``). A request past one is refused with
    ``RequestTooLarge`` (431 for headers, 413 for a session), and the server carries on."""

    header_bytes: int = Field(default=64 * _KIB, ge=1024, description="request line + headers")
    headers: int = Field(default=100, ge=1, description="header lines of one request")
    seed_bytes: int = Field(
        default=16 * _MIB, ge=1, description="resources servers: one /seed_session body"
    )
    sessions_bytes: int = Field(
        default=512 * _MIB,
        ge=1,
        description="resources servers: the seed bodies of all sessions held (oldest dropped)",
    )


def kind_defaults(kind: ServerKind) -> dict[str, Any]:
    """Retry defaults by server kind: model calls are replay-safe, tool calls are not, and an
    agent's ``/run`` is tried once (the collector retries whole rollouts only if asked).

    An environment server's ``max_attempts`` counts *episodes*: a failure it calls non-terminal
    is run again in the run as a new attempt (``episode_id.attempt`` + 1), up to that many. The
    HTTP client itself sends each attempt once (``/run``'s own ``max_attempts: 1``): replaying
    the same attempt of an episode is never what an environment server asks for."""
    if kind == "environment":
        return {
            "max_attempts": 3,
            "idempotent": False,
            "attempt_timeout": 3600.0,
            "endpoints": {"/run": {"max_attempts": 1}},
        }
    if kind == "model":
        return {"max_attempts": 3, "idempotent": True, "attempt_timeout": 600.0}
    if kind == "resources":
        return {
            "max_attempts": 3,
            "idempotent": False,
            "attempt_timeout": 120.0,
            "endpoints": {
                "/verify": {"idempotent": True},
                "/aggregate_metrics": {"idempotent": True},
            },
        }
    return {"max_attempts": 1, "idempotent": False, "attempt_timeout": 3600.0}


FaultKind = Literal[
    "status", "reset_before", "reset_after", "delay", "hang", "malformed_json", "truncated_json"
]


class Fault(_Strict):
    """One kind of injected fault (see ``rollgym.chaos``)."""

    kind: FaultKind
    rate: float = Field(default=0.0, ge=0, le=1)
    status: int = Field(default=503, ge=400, le=599)
    retry_after: float | None = Field(default=None, ge=0)
    seconds: float = Field(default=3600.0, ge=0, le=3600)
    paths: list[str] | None = None


class ChaosSpec(_Strict):
    """A server's ``chaos:`` section: faults injected by a proxy in front of it. Off if absent."""

    seed: int = 0
    faults: list[Fault] = Field(default_factory=list)
    sequence: list[Annotated[int, Field(ge=400, le=599)] | Literal["ok"]] = Field(
        default_factory=list
    )
    paths: list[str] | None = Field(default=None, description="only these paths (default: all)")


def _rates_fit(spec: ChaosSpec) -> ChaosSpec:
    total = sum(f.rate for f in spec.faults)
    if total > 1:
        raise ValueError(
            f"fault rates add up to {total:g}; at most 1 (each request gets one fault)"
        )
    return spec


def _redact_urls(value: Any) -> Any:
    """``value`` with every URL in it (strings holding ``://``, in nested dicts and lists)
    stripped of credentials."""
    if isinstance(value, str):
        return redact_url(value) if "://" in value else value
    if isinstance(value, dict):
        return {k: _redact_urls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_urls(v) for v in value]
    return value


class ServerConfig(_Strict):
    """One server of the run: what it is, how to reach or start it, how to retry calls to it."""

    kind: ServerKind
    impl: str | None = Field(
        default=None,
        description="registered short name, or 'package.module:Class'; required unless url",
    )
    options: dict[str, Any] = Field(default_factory=dict)
    retry: RetryPolicy = RetryPolicy()
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)
    url: str | None = Field(default=None, description="an already-running server; not launched")
    replicas: int = Field(default=1, ge=1, le=64)
    chaos: Annotated[ChaosSpec, AfterValidator(_rates_fit)] | None = Field(
        default=None, description="fault injection (tests/demos)"
    )
    limits: ServerLimits = ServerLimits()

    @model_validator(mode="before")
    @classmethod
    def _kind_retry_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") in typing.get_args(ServerKind):
            merged = _deep_merge(kind_defaults(data["kind"]), data.get("retry") or {})
            data = {**data, "retry": merged}
        return data

    @field_serializer("url", "options")
    def _without_secrets(self, value: Any, info: SerializationInfo) -> Any:
        # A dump is written to run.json and logs by default: credentials in a URL
        # (user:pass@, ?api_key=) are removed. Launchers, which hand the config to the server
        # processes that need the real URLs, ask for them with context={"keep_secrets": True};
        # one that forgets fails loudly (401 upstream) instead of leaking quietly.
        if info.context and info.context.get("keep_secrets"):
            return value
        return _redact_urls(value)

    @model_validator(mode="after")
    def _impl_or_url(self) -> ServerConfig:
        if self.kind == "environment":
            # An environment server is started by its own tool (``gym env start``): rollgym
            # finds one running, like an agent given by URL.
            if self.impl is not None or self.url is None:
                raise ValueError(
                    "an environment server (NeMo Gym 0.7's Environment Server) runs "
                    "elsewhere: give its url:, and no impl: (rollgym does not start one)"
                )
            return self
        # A server given by ``url`` runs elsewhere (rollgym's or not): nothing to import.
        if self.impl is None and self.url is None:
            raise ValueError(
                "impl is required for a server rollgym starts (or give url: for one that "
                "runs elsewhere)"
            )
        return self


class ModelPrice(_Strict):
    """What one model's tokens cost, per million (in the table's currency)."""

    input_per_1m: float = Field(ge=0, description="per 1M input (prompt) tokens")
    output_per_1m: float = Field(ge=0, description="per 1M output (generated) tokens")


class PriceTable(_Strict):
    """A dated price table (``collect.prices``): turns a run's tokens into money
    (``rollgym.collect.cost``). Models are named as their answers name them (``model`` of the
    response, a judge's too); ``default`` prices any other."""

    date: datetime.date = Field(description="when these prices were read (they change)")
    currency: str = Field(default="USD", min_length=1, max_length=16)
    models: dict[str, ModelPrice] = Field(default_factory=dict)
    default: ModelPrice | None = Field(default=None, description="the price of unlisted models")


class BudgetConfig(_Strict):
    """Caps that stop a run cleanly once reached (``collect.budget``): its recorded rollouts'
    tokens (model and judge, input and output), money (needs ``collect.prices``) or sandbox
    CPU seconds (``sandbox_s``), counted across ``--resume``."""

    tokens: int | None = Field(default=None, ge=1, description="model + judge tokens")
    money: float | None = Field(default=None, gt=0, description="in collect.prices' currency")
    sandbox_seconds: float | None = Field(
        default=None, gt=0, description="sandbox CPU seconds (sandbox_s), never wall seconds"
    )
    in_flight: Literal["finish", "abandon"] = Field(
        default="finish",
        description="at the cap, rollouts in flight finish and are recorded (finish), or are "
        "cancelled and left for --resume (abandon)",
    )


class CollectConfig(_Strict):
    """How the collector runs; every field can also be set on the command line."""

    input: str | None = Field(default=None, description="task file, relative to the config")
    agent: str | None = Field(
        default=None,
        description="the agent (or environment server) of rows that name none (every row: "
        "ignore_agent_ref)",
    )
    agent_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="agent_ref names of the task rows -> agent or environment servers",
    )
    taskset_routes: dict[str, str] = Field(
        default_factory=dict,
        description="materialized task rows (NeMo Gym 0.7): taskset -> the agent or environment "
        "server that runs them (not needed with only one of those)",
    )
    ignore_agent_ref: bool = Field(
        default=False, description="run every row with `agent`, whatever its agent_ref (--agent)"
    )
    concurrency: int = Field(default=64, ge=1, le=65536)
    repeats: int = Field(default=1, ge=1, le=100_000)
    limit: int | None = Field(default=None, ge=1)
    rollout_timeout: float = Field(default=600.0, gt=0)
    max_rollout_attempts: int = Field(
        default=3,
        ge=1,
        le=MAX_ATTEMPTS_CAP,
        description="total attempts of one rollout, counted across --resume",
    )
    retry_in_run: bool = Field(
        default=False, description="retry a retryable failed rollout within the same run"
    )
    pass_threshold: float = 1.0
    max_failures: int | None = Field(default=None, ge=1)
    max_failure_rate: float | None = Field(
        default=0.5,
        gt=0,
        le=1,
        description="abort when this fraction of finished rollouts failed (null: never)",
    )
    min_failure_samples: int = Field(default=50, ge=1)
    config_error_window: int = Field(
        default=5, ge=0, description="401/403/404 within the first N rollouts abort the run"
    )
    agent_in_process: bool = Field(
        default=False,
        description="run the agents inside the collector's process: no /run hop, no agent "
        "process (rollgym.collect.launchers.InProcessAgents; not with --ray)",
    )
    mask_exploits: bool = Field(
        default=False,
        description="mask the rollouts whose integrity verdict is exploit (rollgym.audit.scan): "
        "recorded with mask_sample: true, left out of every reward statistic, never a reward "
        "for a trainer (never a 0)",
    )
    prices: PriceTable | None = Field(
        default=None, description="a dated price table: the run's cost in money (cost.json)"
    )
    budget: BudgetConfig | None = Field(
        default=None, description="stop the run cleanly at a cap of tokens, money or sandbox time"
    )

    @model_validator(mode="after")
    def _money_needs_prices(self) -> CollectConfig:
        if self.budget is not None and self.budget.money is not None and self.prices is None:
            raise ValueError(
                "budget.money needs a price table (collect.prices: date, models) to count money"
            )
        return self


class Config(_Strict):
    """A whole config file."""

    servers: dict[str, ServerConfig]
    collect: CollectConfig = CollectConfig()
    source: str | None = Field(default=None, description="the file this came from")

    @field_validator("servers", mode="before")
    @classmethod
    def _names_are_identifiers(cls, value: Any) -> Any:
        # A name becomes a path (logs/<name>.log) and a URL's key: checked before either is
        # made, so a config cannot write a log outside --output ("../../x").
        for name in value if isinstance(value, dict) else ():
            if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name) or ".." in name:
                raise ValueError(
                    f"{str(name)!r} is not a server name: use letters, digits, '_', '.' and "
                    f"'-', starting with a letter or '_', no '..', at most "
                    f"{SERVER_NAME_MAX} characters"
                )
        return value

    @model_validator(mode="after")
    def _references(self) -> Config:
        if not self.servers:
            raise ValueError("at least one server is required")
        # Server options (an agent's peers among them) are the server classes' to check:
        # ``rollgym.server.base.check_servers``, run before anything starts.
        agent = self.collect.agent
        if agent is not None and agent not in self.servers:
            raise ValueError(f"collect.agent: no server named {agent!r}")
        runners = self.dispatchers()
        known = ", ".join(runners) or "none"
        for key, mapping in (
            ("agent_aliases", self.collect.agent_aliases),
            ("taskset_routes", self.collect.taskset_routes),
        ):
            for alias, target in mapping.items():
                if target not in runners:
                    raise ValueError(
                        f"collect.{key}.{alias}: {target!r} is not an agent server, nor an "
                        f"environment server (those of the config: {known})"
                    )
        return self

    def dispatchers(self) -> list[str]:
        """The servers task rows can be sent to: the agent and environment servers."""
        return [n for n, s in self.servers.items() if s.kind in DISPATCH_KINDS]

    def default_dispatcher(self, override: str | None = None) -> str | None:
        """The server of rows that name none: ``override`` (``--agent``), else
        ``collect.agent``, else the config's only agent or environment server, else its only
        agent; ``None`` when there is no such one (then every row must name its server, by
        ``agent_ref`` or taskset). ``ConfigError`` for a name that is no such server."""
        name = override or self.collect.agent
        runners = self.dispatchers()
        if name is not None:
            if name not in runners:
                raise ConfigError(
                    f"{self.source or 'config'}: {name!r} is not an agent server, nor an "
                    "environment server"
                )
            return name
        if len(runners) == 1:
            return runners[0]
        agents = [n for n in runners if self.servers[n].kind == "agent"]
        return agents[0] if len(agents) == 1 else None

    def base_dir(self) -> Path:
        """The config's folder: relative paths in it (``collect.input``) start here, and
        ``impl: module:Class`` finds ``module.py`` here (``rollgym.server.base.resolve_impl``)."""
        return Path(self.source).parent if self.source else Path.cwd()

    def agent_name(self, override: str | None = None) -> str:
        """The agent to dispatch to: named explicitly, or the only agent in the config (an
        environment server counts: ``default_dispatcher``, which must find one)."""
        name = self.default_dispatcher(override)
        if name is None:
            raise ConfigError(
                f"{self.source or 'config'}: name the agent to run with --agent "
                f"(agents in the config: {', '.join(self.dispatchers()) or 'none'})"
            )
        return name


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def format_validation_error(
    source: str,
    exc: ValidationError,
    prefix: str = "",
    *,
    one_line: bool = False,
    names: Mapping[str, str] | None = None,
    model: type[BaseModel] | None = None,
) -> str:
    """The one way rollgym words a pydantic ``ValidationError``: ``source``, then each problem
    as its dotted key (under ``prefix``) and message. A config error lists one problem a line;
    ``one_line`` joins them with ``;`` (an error body of a request). ``names`` words a top-level
    key the way the user gave it instead (``{"repeats": "--repeats"}`` for a command-line flag).
    ``model``: the model validated, so an unknown key can name the known key nearest to it.
    """
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        if names and loc and loc[0] in names:
            key = ".".join([names[loc[0]], *loc[1:]])
        else:
            key = ".".join(p for p in (prefix, *loc) if p != "") or "<top level>"
        problem = _problem(err)
        if err["type"] == "extra_forbidden" and model is not None and loc:
            problem += _nearest(loc[-1], _known_keys(model, err["loc"][:-1]))
        problems.append(f"{key}: {problem}")
    if one_line:
        return f"{source}: {'; '.join(problems)}"
    return "\n  ".join([f"{source}: invalid config", *problems])


def _problem(err: ErrorDetails) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "value_error" and "error" in (err.get("ctx") or {}):
        # Our own validators' messages, without pydantic's "Value error, " in front.
        return str(err["ctx"]["error"])
    return str(err["msg"])


def _nearest(key: str, known: list[str]) -> str:
    """ " (did you mean KEY?)", or the keys to choose from when none is near."""
    if not known:
        return ""
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if near:
        return f" (did you mean {near[0]}?)"
    return f" (known keys: {', '.join(sorted(known))})"


def _known_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys of the model found at ``loc`` under ``model`` ([] if none is there)."""
    current: Any = model
    for part in loc:
        current = _child(current, part)
        if current is None:
            return []
    return list(current.model_fields) if _is_model(current) else []


def _child(tp: Any, part: str | int) -> Any:
    """The type of ``tp``'s member ``part``: a model's field, a dict's value, a list's item."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _child(typing.get_args(tp)[0], part)
    if origin in (Union, types.UnionType):
        arms = [_child(arm, part) for arm in typing.get_args(tp) if arm is not type(None)]
        return next((arm for arm in arms if arm is not None), None)
    if _is_model(tp):
        field = tp.model_fields.get(str(part))
        return None if field is None else _unwrap(field.annotation)
    if origin in (dict, Mapping):
        return _unwrap(typing.get_args(tp)[1])
    if origin in (list, tuple, Sequence):
        return _unwrap(typing.get_args(tp)[0])
    return None


def _unwrap(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and ``| None``: the model (or container) a key lives in."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(arms[0]) if len(arms) == 1 else tp
    return tp


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def parse_config(data: Any, source: str = "<config>") -> Config:
    """Validate a config dict; raise ``ConfigError`` naming ``source`` and each bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the config must be a mapping with a 'servers' key")
    try:
        return Config.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, model=Config)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_message(path, exc)) from None
    return parse_config(data, str(path))


def yaml_error_message(path: Path, exc: yaml.YAMLError) -> str:
    """A YAML error as FILE:LINE:COLUMN and what is wrong there (PyYAML's own text names a
    ``<unicode string>`` instead of the file)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"{path}: not valid YAML: {exc}"
    mark, what = exc.problem_mark, str(exc.problem)
    if exc.context:
        where = exc.context_mark
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        what += f" ({exc.context}{at})"
    return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {what}"
