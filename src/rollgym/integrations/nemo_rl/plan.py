"""NeMo RL's NeMo Gym config -> a rollgym config and how to run it (``RunHelper.start``'s plan).

NeMo RL's ``_spinup`` hands ``RunHelper.start`` the ``env.nemo_gym`` section of its yaml plus
keys of its own. A rollgym user names a rollgym config in that section::

    env:
      nemo_gym:
        rollgym_config: configs/mcqa_training.yaml   # a path, or the config inline (a mapping)

and writes ``${policy_base_url}``, ``${policy_model_name}`` or ``${policy_api_key}`` in it where
NeMo RL's values go (a string that is only the placeholder takes
the value as it is: NeMo RL's list of per-DP-rank vLLM URLs stays a list, so an
``openai_proxy``'s ``base_url: ${policy_base_url}`` gets one replica per rank).

The other keys NeMo RL sets and rollgym honours: ``default_host`` (the host of every server whose
entry names none), ``port_range_low`` / ``port_range_high`` (free ports in that range for every
server whose entry names none), ``head_server`` (where the head server listens),
``global_aiohttp_connector_limit`` (the collector's connection pool), ``nemo_gym_log_dir``,
``server_spinup_timeout_seconds`` and ``model_endpoint_readiness_timeout_seconds``. Every other
key is reported in one warning, never silently ignored.
"""

from __future__ import annotations

import importlib
import random
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rollgym.config import Config, parse_config, yaml_error_message
from rollgym.errors import ConfigError
from rollgym.launch.ports import bind_socket
from rollgym.wire import ROLLGYM_CONFIG, ROLLGYM_MAX_RESTARTS

HEAD_SERVER_KEY_NAME = "head_server"
DEFAULT_HEAD_SERVER_PORT = 11000
"""The default, for a config that names no head server."""

PLACEHOLDERS = ("policy_base_url", "policy_model_name", "policy_api_key")
"""NeMo RL's values that a rollgym config takes where it writes ``${name}``."""

HONOURED = frozenset(
    {
        ROLLGYM_CONFIG,
        ROLLGYM_MAX_RESTARTS,
        HEAD_SERVER_KEY_NAME,
        "default_host",
        "port_range_low",
        "port_range_high",
        "global_aiohttp_connector_limit",
        "nemo_gym_log_dir",
        "server_spinup_timeout_seconds",
        "model_endpoint_readiness_timeout_seconds",
        *PLACEHOLDERS,
    }
)

WHY_IGNORED = {
    "ray_head_node_address": "rollgym starts its servers as processes of this one, not on Ray",
    "config_paths": "NeMo Gym server configs; rollgym runs the servers of rollgym_config",
    "global_aiohttp_connector_limit_per_host": "rollgym's pool has one limit "
    "(global_aiohttp_connector_limit)",
}

STARTUP_TIMEOUT = 600.0
"""The default ``server_spinup_timeout_seconds``; so is the model readiness wait's."""

_PLACEHOLDER = re.compile(r"\$\{(" + "|".join(PLACEHOLDERS) + r")\}")


class RollgymCompatWarning(UserWarning):
    """A setting of the config that rollgym does not honour (named in the message)."""


@dataclass(frozen=True)
class StackPlan:
    """What ``RunHelper.start`` starts, decided before anything starts."""

    config: Config
    head_host: str
    head_port: int
    log_dir: Path | None
    startup_timeout: float
    model_wait: float
    """Seconds to wait for NeMo RL's vLLM URLs to answer (0: do not wait)."""
    policy_urls: tuple[str, ...]
    policy_model: str | None
    """The model server given ``${policy_base_url}``: it tokenizes a failed row's prompt."""
    connections: int | None
    concurrency: int | None
    """``collect.concurrency`` when the rollgym config sets it; None: every row at once."""
    max_restarts: int


def plain(value: Any) -> Any:
    """A NeMo RL config value (an omegaconf ``DictConfig``, any mapping or sequence) as plain
    dicts and lists; omegaconf's interpolations stay unresolved, for ``substitute``."""
    if type(value).__module__.startswith("omegaconf"):
        omegaconf = importlib.import_module("omegaconf")
        value = omegaconf.OmegaConf.to_container(value, resolve=False)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes))
    ):
        return [plain(v) for v in value]
    return value


def global_config(
    initial: Any, dotenv_path: Path | None, *, skip_dotenv: bool, skip_cli: bool
) -> dict[str, Any]:
    """The global config as ``RunHelper.start`` merges it: the dotenv yaml (``env.yaml`` in
    the working directory by default), overridden by ``initial``."""
    merged: dict[str, Any] = {}
    path = dotenv_path if dotenv_path is not None else Path("env.yaml")
    if not skip_dotenv and path.is_file():
        merged = _mapping(_read_yaml(path), str(path))
    merged.update(plain(initial) if initial is not None else {})
    if not skip_cli:
        warnings.warn(
            "skip_load_from_cli=False: rollgym reads no Hydra overrides from the command line",
            RollgymCompatWarning,
            stacklevel=3,
        )
    return merged


def make_plan(settings: dict[str, Any]) -> StackPlan:
    """Turn the merged global config into a plan; ``ConfigError`` names the key at fault."""
    raw, source = _rollgym_raw(settings)
    values = {name: settings[name] for name in PLACEHOLDERS if name in settings}
    if not isinstance(raw.get("servers"), dict):
        raise ConfigError(f"{source}: the config must be a mapping with a 'servers' key")
    policy_model = _policy_model(raw["servers"]) if "policy_base_url" in values else None
    used: set[str] = set()
    raw = substitute(raw, values, used)
    servers = raw["servers"]
    default_host = _opt_str(settings, "default_host")
    low, high = settings.get("port_range_low"), settings.get("port_range_high")
    head = settings.get(HEAD_SERVER_KEY_NAME) or {}
    if not isinstance(head, dict):
        raise ConfigError(f"{HEAD_SERVER_KEY_NAME}: must be a mapping with host and port")
    head_host = str(head.get("host") or default_host or "127.0.0.1")
    head_port = _int(head.get("port", DEFAULT_HEAD_SERVER_PORT), f"{HEAD_SERVER_KEY_NAME}.port")
    _place(servers, default_host, low, high, taken={head_port})
    config = parse_config(raw, source)
    collect = raw.get("collect") if isinstance(raw.get("collect"), dict) else {}
    concurrency = config.collect.concurrency if "concurrency" in collect else None
    log_dir = settings.get("nemo_gym_log_dir")
    _warn_ignored(settings, used, values)
    return StackPlan(
        config=config,
        head_host=head_host,
        head_port=head_port,
        log_dir=Path(log_dir) if log_dir else None,
        startup_timeout=_seconds(settings, "server_spinup_timeout_seconds", STARTUP_TIMEOUT),
        model_wait=_seconds(settings, "model_endpoint_readiness_timeout_seconds", STARTUP_TIMEOUT),
        policy_urls=_urls(values.get("policy_base_url")),
        policy_model=policy_model,
        connections=_opt_int(settings, "global_aiohttp_connector_limit"),
        concurrency=concurrency,
        max_restarts=_int(settings.get(ROLLGYM_MAX_RESTARTS, 3), ROLLGYM_MAX_RESTARTS),
    )


def substitute(value: Any, values: Mapping[str, Any], used: set[str]) -> Any:
    """``value`` with every ``${policy_...}`` replaced by NeMo RL's value; the names met go into
    ``used``. A string that is only the placeholder takes the value unchanged (a list stays a
    list); inside a longer string the value must be a string or a number."""
    if isinstance(value, dict):
        return {k: substitute(v, values, used) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, values, used) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value
    whole = _PLACEHOLDER.fullmatch(value)
    if whole is not None:
        return _value(whole.group(1), values, used)

    def one(match: re.Match[str]) -> str:
        got = _value(match.group(1), values, used)
        if isinstance(got, (list, dict)):
            raise ConfigError(
                f"{value!r}: ${{{match.group(1)}}} is a {type(got).__name__} here; write it "
                "alone as the value to pass it whole"
            )
        return str(got)

    return _PLACEHOLDER.sub(one, value)


def _value(name: str, values: Mapping[str, Any], used: set[str]) -> Any:
    if name not in values:
        raise ConfigError(
            f"the rollgym config uses ${{{name}}}, which the NeMo Gym config does not set"
        )
    used.add(name)
    return values[name]


def _rollgym_raw(settings: dict[str, Any]) -> tuple[dict[str, Any], str]:
    given = settings.get(ROLLGYM_CONFIG)
    if given is None:
        raise ConfigError(
            f"rollgym's RunHelper needs {ROLLGYM_CONFIG!r} in the NeMo Gym config (NeMo RL: "
            f"env.nemo_gym.{ROLLGYM_CONFIG}): the path of a rollgym config, or one inline"
        )
    if isinstance(given, dict):
        return plain(given), f"<{ROLLGYM_CONFIG}>"
    if isinstance(given, (str, Path)):
        path = Path(given)
        return _mapping(_read_yaml(path), str(path)), str(path)
    raise ConfigError(f"{ROLLGYM_CONFIG}: a path or a mapping, not {type(given).__name__}")


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_message(path, exc)) from None


def _mapping(data: Any, source: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must be a mapping")
    return data


def _policy_model(servers: dict[str, Any]) -> str | None:
    """The model server whose options say ``${policy_base_url}`` (the first, if several)."""
    for name, entry in servers.items():
        is_model = isinstance(entry, dict) and entry.get("kind") == "model"
        if is_model and "${policy_base_url}" in str(entry.get("options")):
            return str(name)
    return None


def _place(
    servers: dict[str, Any], host: str | None, low: Any, high: Any, *, taken: set[int]
) -> None:
    """Give every launched server without a ``host`` NeMo RL's ``default_host``, and without a
    ``port`` free ports in ``[low, high)`` (one per replica, consecutive)."""
    ranged = low is not None and high is not None
    lo = _int(low, "port_range_low") if ranged else 0
    hi = _int(high, "port_range_high") if ranged else 0
    for entry in servers.values():
        if not isinstance(entry, dict) or entry.get("url"):
            continue
        if host and "host" not in entry:
            entry["host"] = host
        if ranged and "port" not in entry:
            replicas = entry.get("replicas", 1)
            count = replicas if isinstance(replicas, int) and replicas > 0 else 1
            entry["port"] = _free_ports(str(entry.get("host") or "127.0.0.1"), count, lo, hi, taken)


def _free_ports(host: str, count: int, low: int, high: int, taken: set[int]) -> int:
    """The first of ``count`` consecutive ports in ``[low, high)`` that ``host`` can bind, from a
    random start (two NeMo RL actors on one node pick apart); they join ``taken``."""
    starts = list(range(low, high - count + 1))
    if not starts:
        raise ConfigError(f"port range [{low}, {high}) has no room for {count} port(s)")
    first = random.randrange(len(starts))
    for start in starts[first:] + starts[:first]:
        ports = range(start, start + count)
        if any(p in taken for p in ports) or not all(_bindable(host, p) for p in ports):
            continue
        taken.update(ports)
        return start
    raise ConfigError(f"no {count} free consecutive port(s) in [{low}, {high}) on {host}")


def _bindable(host: str, port: int) -> bool:
    try:
        bind_socket(host, port).close()
    except OSError:
        return False
    return True


def _warn_ignored(settings: dict[str, Any], used: set[str], values: Mapping[str, Any]) -> None:
    problems = []
    for key in sorted(set(settings) - HONOURED):
        why = WHY_IGNORED.get(key)
        problems.append(f"{key} ({why})" if why else key)
    for name in PLACEHOLDERS:
        if name in values and name not in used:
            problems.append(f"{name} (the rollgym config never says ${{{name}}})")
    if problems:
        warnings.warn(
            "rollgym does not use these NeMo Gym settings: " + "; ".join(problems),
            RollgymCompatWarning,
            stacklevel=4,
        )


def _urls(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Iterable):
        return tuple(str(v) for v in value)
    return ()


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: must be an integer, not {value!r}")
    return value


def _opt_int(settings: dict[str, Any], key: str) -> int | None:
    value = settings.get(key)
    return None if value is None else _int(value, key)


def _opt_str(settings: dict[str, Any], key: str) -> str | None:
    value = settings.get(key)
    return None if value is None else str(value)


def _seconds(settings: dict[str, Any], key: str, default: float) -> float:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{key}: must be a number of seconds >= 0, not {value!r}")
    return float(value)
