"""``rollgym audit`` of a config: start its servers, audit every resources server, stop them.

Servers rollgym launches are started as ``rollgym check`` starts them (``Supervisor``), its
agents left out (the audit plays the agent); servers given by ``url:`` are audited where they
run. Rows come from the config's task file or ``--input``: a row goes to the resources server
its agent verifies with (every row to every server when the config does not say), ``limit``
of them, spread evenly over the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rollgym.audit.play import ServerAudit, audit_server
from rollgym.audit.target import CONCURRENCY, TIMEOUT, AuditDialect, Environment, Player
from rollgym.config import Config
from rollgym.errors import ConfigError, InputError
from rollgym.http import HttpClient
from rollgym.launch.supervisor import Supervisor

AUDIT_FILE = "audit.json"
LIMIT = 8


@dataclass(frozen=True)
class AuditReport:
    servers: dict[str, ServerAudit]

    @property
    def clean(self) -> bool:
        return all(s.verdict == "clean" for s in self.servers.values())

    def to_dict(self) -> dict[str, Any]:
        return {"servers": {name: s.to_dict() for name, s in self.servers.items()}}

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / AUDIT_FILE
        path.write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))
        return path


def resources_servers(config: Config) -> list[str]:
    names = [n for n, s in config.servers.items() if s.kind == "resources"]
    if not names:
        raise ConfigError(f"{config.source or 'config'}: servers: no resources server to audit")
    return names


def input_path(config: Config, given: Path | None) -> Path:
    """The task file: ``given`` (``--input``), else the config's ``collect.input``."""
    if given is not None:
        path = given
    elif config.collect.input:
        path = config.base_dir() / config.collect.input
    else:
        raise ConfigError(
            f"{config.source or 'config'}: collect.input names no task file (give --input)"
        )
    if not path.is_file():
        key = "--input" if given is not None else "collect.input"
        raise ConfigError(f"{config.source or 'config'}: {key}: no file {str(path)!r}")
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(row, dict) or not isinstance(row.get("responses_create_params"), dict):
            raise InputError(f"{path}:{number}: a task row needs responses_create_params")
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: no task rows")
    return rows


def sample(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """``limit`` rows spread evenly over ``rows`` (all of them if fewer): the same each time."""
    if len(rows) <= limit:
        return rows
    return [rows[i * len(rows) // limit] for i in range(limit)]


def rows_of(config: Config, server: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows run against ``server``: those of the agents whose ``resources`` it is (by
    ``agent_ref``, else the default agent); all rows when no agent names it."""
    agents = {
        name for name, s in config.servers.items()
        # Read raw: the agent's typed options are its class's, and the audit starts no agent.
        if s.kind == "agent" and s.options.get("resources") == server
    }  # fmt: skip
    if not agents:
        return rows
    default = config.default_dispatcher()

    def agent_of(row: dict[str, Any]) -> str | None:
        ref = row.get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        name = config.collect.agent_aliases.get(name, name) if name else None
        return name if name in config.servers else default

    return [r for r in rows if agent_of(r) in agents]


async def audit_config(
    config: Config,
    *,
    input: Path | None = None,
    limit: int = LIMIT,
    timeout: float = TIMEOUT,
    concurrency: int = CONCURRENCY,
    log_dir: Path | None = None,
    dialects: Sequence[AuditDialect] = (),
) -> AuditReport:
    """Audit every resources server of ``config`` on ``limit`` rows of its task file;
    ``dialects`` (``rollgym.dialects.AUDIT_DIALECTS``) play the servers they recognize."""
    names = resources_servers(config)
    rows = read_rows(input_path(config, input))
    agents = [n for n, s in config.servers.items() if s.kind != "resources" and s.kind != "model"]
    supervisor = Supervisor(config, log_dir=log_dir, skip=agents)
    audits: dict[str, ServerAudit] = {}
    try:
        urls = await supervisor.start()
        async with HttpClient() as http:
            for name in names:
                async with AsyncExitStack() as stack:
                    env: Player | None = None
                    for dialect in dialects:
                        env = await stack.enter_async_context(
                            dialect(name, urls[name][0], timeout, concurrency)
                        )
                        if env is not None:
                            break
                    env = env or Environment(
                        http, name, urls[name][0], timeout=timeout, concurrency=concurrency
                    )
                    audits[name] = await audit_server(
                        env, sample(rows_of(config, name, rows), limit)
                    )
    finally:
        await supervisor.stop()
    return AuditReport(audits)
