"""Which environment scored a run: every resources server's fingerprint, asked once per run.

At the start of each session the collector asks every replica of every resources server for its
``/fingerprint`` (``rollgym.server.fingerprint``: computed once when the server started, so the
answer is cheap) and writes them to ``run.json``'s ``fingerprints`` (server -> the fingerprint,
with its short ``id``); each record then names its environment's by that id
(``rollgym_fingerprint``). A server that does not answer (a foreign ``url:`` server, one from
before fingerprints) is recorded as ``{"id": null, "unknown": "why"}``: said plainly, never a
failure of the run. Replicas of one server that answer different fingerprints stop the run
before it dispatches anything (``ConfigError`` naming the replicas, their ids and the files
that differ): which replica scored a record is not known here, so no stamp could be right, and
days of rewards from two verifiers mixed are worse than a run refused at its start.
``compare_fingerprints`` says what differs between two runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollgym.collect.layout import RUN_JSON, RunDir
from rollgym.config import Config
from rollgym.http import HttpClient
from rollgym.server.fingerprint import ask_replicas, differences, refuse_mixed


async def ask_fingerprints(
    client: HttpClient, config: Config, urls: dict[str, list[str]]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each resources server's fingerprint, asked of every replica, and warnings naming a
    server or replica that gives none (``rollgym.server.fingerprint.agreed``). ``ConfigError``
    when the replicas of one server answer different fingerprints (``refuse_mixed``): the run
    stops before it dispatches anything."""
    names = [n for n, s in config.servers.items() if s.kind == "resources" and n in urls]
    asked = await asyncio.gather(*(ask_replicas(client, name, urls[name]) for name in names))
    found: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for name, (print_, said) in zip(names, asked, strict=True):
        refuse_mixed(name, print_)
        if print_.get("id") is None and config.servers[name].impl is None:
            print_["unknown"] += (
                "; it is given by url: and was not started by rollgym (an OpenEnv server, "
                "another framework's): only a server that serves /fingerprint can say what "
                "scores its rollouts"
            )
        found[name] = print_
        warnings.extend(said)
        if print_.get("id") is None:
            warnings.append(
                f"server {name}: {print_.get('unknown')}: which environment scored its "
                "rollouts is not recorded (its records carry no rollgym_fingerprint)"
            )
    return found, warnings


def recorded_fingerprints(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Server -> fingerprint, as the run in ``out_dir`` recorded them: its current session's,
    then those of earlier sessions (``history``) for servers it no longer names."""
    info = RunDir(out_dir).read_json(RUN_JSON)
    found: dict[str, dict[str, Any]] = {}
    for session in [info, *reversed(info.get("history") or [])]:
        prints = session.get("fingerprints") if isinstance(session, dict) else None
        if isinstance(prints, dict):
            for name, print_ in prints.items():
                if isinstance(print_, dict):
                    found.setdefault(str(name), print_)
    return found


def compare_fingerprints(base: Path, other: Path) -> list[str]:
    """Sentences saying where the run in ``other`` was scored by another environment than the
    run in ``base`` (server by server, naming the part: code, data, version, rollgym), or that
    it cannot be told (a fingerprint unknown or not recorded). Empty: the same environments."""
    one, two = recorded_fingerprints(base), recorded_fingerprints(other)
    said: list[str] = []
    for name in sorted(one.keys() | two.keys()):
        a, b = one.get(name), two.get(name)
        if a is None or b is None:
            which = base if a is None else other
            said.append(f"environment {name}: not recorded in {which.name}: cannot be compared")
            continue
        if a.get("id") is None or b.get("id") is None:
            why = a.get("unknown") or b.get("unknown")
            said.append(f"environment {name}: fingerprint unknown ({why}): cannot be compared")
            continue
        if a["id"] == b["id"]:
            continue
        parts = "; ".join(differences(a, b)) or "differs"
        said.append(
            f"environment {name}: scored by different environments ({a['id']} in "
            f"{base.name}, {b['id']} in {other.name}): {parts}"
        )
    return said
