"""A Harbor task directory, read: ``task.toml``, ``instruction.md``, ``environment/Dockerfile``,
``tests/test.sh``, ``solution/solve.sh``.

``task.toml`` is read into ``TaskConfig``, the fields of Harbor's own model (``harbor`` 0.25's
``harbor.models.task.config``) that decide a trial: the agent's and verifier's timeouts and
environments, the container's cpus, memory, storage and network. Keys Harbor knows and rollgym
does not run (multi-step tasks, GPUs, MCP servers, a separate verifier image) are refused by name,
never ignored; other keys are ignored as Harbor ignores them.

One difference from Harbor, on purpose: the network is off unless ``task.toml`` turns it on
(``[environment] network_mode = "public"`` or ``allow_internet = true``). Harbor's default is
public; a policy with a network can fetch an answer.

A directory of tasks is an environment: ``load_tasks`` reads every subdirectory holding a
``task.toml`` (sorted by name), and ``task_rows`` makes one row per task.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rollgym.config import format_validation_error
from rollgym.errors import ConfigError

HARBOR_ROW = "harbor"
"""The row field naming the task: ``{"task": NAME}`` (looked up in the server's directory)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PackageInfo(_Section):
    name: str | None = None
    version: str | None = None
    description: str | None = None


class AgentConfig(_Section):
    timeout_sec: float | None = Field(default=None, gt=0)
    user: str | int | None = None


class VerifierConfig(_Section):
    timeout_sec: float = Field(default=600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    environment: dict[str, Any] | None = None

    @field_validator("environment")
    @classmethod
    def _one_image(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            raise ValueError("a separate verifier environment is not supported by rollgym")
        return value


class EnvironmentConfig(_Section):
    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: str | None = None
    os: Literal["linux"] = "linux"
    cpus: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=16)
    storage_mb: int | None = Field(default=None, ge=1)
    gpus: int | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    network_mode: Literal["no-network", "public", "allowlist"] | None = None
    allow_internet: bool | None = None
    mcp_servers: list[Any] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _legacy_sizes(cls, data: Any) -> Any:
        """Harbor's legacy ``memory = "2G"`` / ``storage = "10G"`` (G=1024 MB, M, K)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for legacy, key in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if isinstance(data.get(legacy), str):
                data.setdefault(key, _size_mb(data.pop(legacy), legacy))
        return data

    @field_validator("os", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("gpus")
    @classmethod
    def _no_gpus(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("GPUs are not supported by rollgym's containers")
        return value

    @field_validator("mcp_servers")
    @classmethod
    def _no_mcp(cls, value: list[Any]) -> list[Any]:
        if value:
            raise ValueError("MCP servers are not supported by rollgym")
        return value

    @field_validator("network_mode")
    @classmethod
    def _no_allowlist(cls, value: str | None) -> str | None:
        if value == "allowlist":
            raise ValueError("an allowlist network is not supported: use no-network or public")
        return value

    @property
    def network(self) -> bool:
        """Whether the task's containers get a network (off unless the task says so)."""
        if self.network_mode is not None:
            return self.network_mode == "public"
        return bool(self.allow_internet)


def _size_mb(text: str, key: str) -> int:
    size = text.strip().upper()
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if not size or size[-1] not in units:
        raise ValueError(f"{key}: {text!r} is no size like '1G' or '512M'")
    try:
        return int(float(size[:-1]) * units[size[-1]])
    except ValueError:
        raise ValueError(f"{key}: {text!r} is no size like '1G' or '512M'") from None


class SolutionConfig(_Section):
    env: dict[str, str] = Field(default_factory=dict)


ROLLGYM_PREFIX = "rollgym_"
KEEP_SYSTEM_CHANGES = "rollgym_keep_system_changes"
ROLLGYM_KEYS = frozenset({KEEP_SYSTEM_CHANGES})
"""rollgym's keys in ``task.toml``'s ``[metadata]``: ``rollgym_keep_system_changes = true``
carries the agent's changes to the system trees (``/usr``, ``/bin``, ``/lib*``, ...) into the
verifier, for a task whose work is changing the system (they are then flagged)."""


class TaskConfig(_Section):
    """``task.toml``: Harbor's fields that decide how a trial runs."""

    schema_version: str = "1.4"
    version: str | None = None  # older tasks' name for schema_version
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: str | None = None
    steps: list[Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _rollgym_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        """rollgym's own keys in ``[metadata]`` (Harbor keeps the table as it is): known names
        only, and booleans, so a misspelt one is an error, not a setting silently off."""
        for key, item in value.items():
            if not key.startswith(ROLLGYM_PREFIX):
                continue
            if key not in ROLLGYM_KEYS:
                raise ValueError(
                    f"unknown rollgym key {key!r} (known: {', '.join(sorted(ROLLGYM_KEYS))})"
                )
            if not isinstance(item, bool):
                raise ValueError(f"{key} must be true or false, not {item!r:.40}")
        return value

    @field_validator("steps")
    @classmethod
    def _one_step(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("multi-step tasks are not supported by rollgym")
        return value


@dataclass(frozen=True)
class HarborTask:
    """One task directory, read and checked."""

    name: str
    path: Path
    config: TaskConfig
    instruction: str

    @property
    def dockerfile(self) -> Path:
        return self.path / "environment" / "Dockerfile"

    @property
    def context(self) -> Path:
        """The build context: ``environment/``."""
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def test_script(self) -> Path:
        return self.tests_dir / "test.sh"

    @property
    def solution(self) -> Path:
        return self.path / "solution" / "solve.sh"

    @property
    def agent_timeout(self) -> float:
        """Seconds the agent phase may last (Harbor has no default; ours: 600)."""
        return self.config.agent.timeout_sec or 600.0

    @property
    def keep_system_changes(self) -> bool:
        """Whether the verifier takes the agent's changes to the system trees too."""
        return bool(self.config.metadata.get(KEEP_SYSTEM_CHANGES, False))

    def row(self) -> dict[str, Any]:
        """The task as a task row: the instruction is the prompt; the row names the task, never
        its tests or solution."""
        return {
            "responses_create_params": {"input": self.instruction},
            HARBOR_ROW: {"task": self.name},
        }


_CANARY_LINE = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)


def strip_canary(text: str) -> str:
    """The instruction without its leading canary lines (data-provenance markers, never shown
    to an agent) and the blank lines after them: Harbor's ``strip_canary``, to the letter."""
    lines = text.split("\n")
    idx = 0
    while idx < len(lines) and _CANARY_LINE.match(lines[idx].strip()):
        idx += 1
    while idx < len(lines) and lines[idx].strip() == "":
        idx += 1
    return "\n".join(lines[idx:])


def load_task(path: Path) -> HarborTask:
    """Read the task directory ``path``; a ``ConfigError`` naming the file and key otherwise."""
    path = Path(path)
    toml_path = path / "task.toml"
    try:
        raw = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{toml_path}: missing (a Harbor task directory holds task.toml)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{toml_path}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{toml_path}: not valid TOML: {exc}") from None
    try:
        config = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(str(toml_path), exc)) from None
    instruction_path = path / "instruction.md"
    try:
        instruction = instruction_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{instruction_path}: missing (the task's prompt)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{instruction_path}: cannot be read: {exc}") from None
    if not instruction.strip():
        raise ConfigError(f"{instruction_path}: empty (the task's prompt)")
    instruction = strip_canary(instruction)
    task = HarborTask(name=path.name, path=path, config=config, instruction=instruction)
    if config.environment.docker_image is None and not task.dockerfile.is_file():
        raise ConfigError(
            f"{task.dockerfile}: missing (or name a prebuilt image: [environment] docker_image "
            f"in {toml_path})"
        )
    if not task.test_script.is_file():
        raise ConfigError(f"{task.test_script}: missing (the task's verifier)")
    return task


def load_tasks(directory: Path) -> list[HarborTask]:
    """Every task under ``directory`` (each subdirectory with a ``task.toml``, by name), or the
    one task ``directory`` is."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory of Harbor tasks")
    if (directory / "task.toml").is_file():
        return [load_task(directory)]
    tasks = [load_task(sub) for sub in sorted(directory.iterdir()) if (sub / "task.toml").is_file()]
    if not tasks:
        raise ConfigError(f"{directory}: no Harbor task in it (no */task.toml)")
    return tasks


def task_rows(directory: Path, tools: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One task row per task of ``directory``, offering ``tools`` (function tools) to the model."""
    rows = []
    for task in load_tasks(directory):
        row = task.row()
        if tools:
            row["responses_create_params"]["tools"] = tools
        rows.append(row)
    return rows
