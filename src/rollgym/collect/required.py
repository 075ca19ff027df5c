"""Rows without a field their environment requires, found before anything is dispatched.

A resources server names the row fields every row must carry (``required_row_fields``, in its
``/health``). A row without one would fail at ``/verify``, once per rollout, after its model
calls were paid for; the collector refuses the task file instead, naming the first rows by
``file:line`` and the field, so the file is fixed once and the run started again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.dialect import Dialects
from rollgym.collect.peers import resources_of
from rollgym.collect.route import AgentRoute
from rollgym.config import Config
from rollgym.errors import ConfigError, InputError

Health = Callable[[str], Awaitable[dict[str, Any] | None]]

SHOWN = 5
"""Rows named in the refusal; the rest are counted."""


async def check_rows(
    config: Config,
    route: AgentRoute,
    task_file: Path,
    tasks: int,
    health: Health,
    dialects: Dialects | None = None,
) -> None:
    """Refuse ``task_file`` (its first ``tasks`` rows) if a flat row lacks a field that the
    resources server of its agent requires (``required_row_fields`` in that server's
    ``/health``, asked with ``health``; a server that does not say requires nothing). A row of
    another of ``dialects`` is its server's to read."""
    resources: dict[str, str] = {}
    for agent in route.agents:
        spec = config.servers.get(agent)
        if spec is None or spec.kind != "agent":
            continue
        try:
            resources[agent] = resources_of(config, agent)
        except ConfigError:
            continue  # an agent without a resources server of the run: nothing to check
    servers = sorted(set(resources.values()))
    said = dict(zip(servers, await asyncio.gather(*(health(s) for s in servers)), strict=True))
    needs = {s: _required(answer) for s, answer in said.items()}
    if not any(needs.values()):
        return

    def required(row: dict[str, object]) -> tuple[str, Collection[str]]:
        ref = row.get("agent_ref")
        agent = route.agent_for(ref.get("name") if isinstance(ref, dict) else None)
        server = resources.get(agent or "", "")
        return server, needs.get(server, ())

    refuse_missing_fields(task_file, tasks, required, dialects)


def _required(health: dict[str, Any] | None) -> frozenset[str]:
    fields = health.get("required_row_fields") if isinstance(health, dict) else None
    return frozenset(str(f) for f in fields) if isinstance(fields, list) else frozenset()


def missing_fields(
    path: Path,
    limit: int,
    required: Callable[[dict[str, object]], tuple[str, Collection[str]]],
    dialects: Dialects | None = None,
) -> Iterator[tuple[int, str, list[str]]]:
    """``(line, server, fields)`` for each of the first ``limit`` flat rows of the task file at
    ``path`` that lacks fields ``required(row)`` says its server (named) needs. The file was
    validated when the run was prepared; a row of another of ``dialects`` is skipped."""
    dialects = dialects or Dialects()
    seen = 0
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):  # as scan_tasks numbers them
            if seen >= limit:
                return
            if not line.strip():
                continue
            seen += 1
            row = orjson.loads(line)
            if not isinstance(row, dict) or dialects.claimed(row):
                continue
            server, fields = required(row)
            lacking = sorted(f for f in fields if f not in row)
            if lacking:
                yield number, server, lacking


def refuse_missing_fields(
    path: Path,
    limit: int,
    required: Callable[[dict[str, object]], tuple[str, Collection[str]]],
    dialects: Dialects | None = None,
) -> None:
    """Raise ``InputError`` naming the first rows of ``path`` that lack a required field."""
    found = list(missing_fields(path, limit, required, dialects))
    if not found:
        return
    shown = "; ".join(
        f"{path}:{number}: no {', '.join(repr(f) for f in fields)} (server {server} needs it)"
        for number, server, fields in found[:SHOWN]
    )
    more = f"; and {len(found) - SHOWN} more rows" if len(found) > SHOWN else ""
    raise InputError(
        f"{shown}{more}. {len(found)} row(s) lack a field their environment requires "
        "(required_row_fields): add it, or leave those rows out. Nothing was dispatched."
    )
