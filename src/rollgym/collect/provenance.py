"""Which environment scored a run: every resources server's fingerprint, asked once per run.

At the start of each session the collector asks every replica of every resources server for its
``/fingerprint`` (``rollgym.server.fingerprint``: computed once when the server started, so the
answer is cheap) and writes them to ``run.json``'s ``fingerprints`` (server -> the fingerprint,
with its short ``id``); each record then names its environment's by that id
(``rollgym_fingerprint``). A server that does not answer (a foreign ``url:`` server, one from
before fingerprints) is recorded as ``{"id": null, "unknown": "why"}``: said plainly, never a
failure of the run. ``compare_fingerprints`` says what differs between two runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollgym.collect.layout import RUN_JSON, RunDir
from rollgym.config import Config, RetryPolicy
from rollgym.errors import RollgymError
from rollgym.http import HttpClient, Target
from rollgym.server.fingerprint import differences
from rollgym.wire import FINGERPRINT_ENDPOINT

ASK_TIMEOUT = 5.0
"""Seconds a server has to answer ``/fingerprint``: it informs, it never holds a run up."""


async def ask_fingerprint(client: HttpClient, name: str, url: str) -> dict[str, Any]:
    """The fingerprint server ``name`` at ``url`` answers (a rollgym agent answers its
    resources server's), or ``{"id": None, "unknown": why}``; asked once, never raising."""
    once = RetryPolicy(max_attempts=1, attempt_timeout=ASK_TIMEOUT)
    target = Target.single(f"{name}.fingerprint", url, once)
    try:
        said = await client.call(target, FINGERPRINT_ENDPOINT, {}, deadline=ASK_TIMEOUT)
    except RollgymError as err:
        return {"id": None, "unknown": f"no /fingerprint ({err.type}: {err.message[:200]})"}
    if not isinstance(said, dict) or not isinstance(said.get("id"), str):
        return {"id": None, "unknown": "its /fingerprint answer names no id"}
    return said


async def ask_fingerprints(
    client: HttpClient, config: Config, urls: dict[str, list[str]]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Each resources server's fingerprint (its first replica's), and warnings naming a
    server that gives none and a replica whose fingerprint differs from its first one's."""
    names = [n for n, s in config.servers.items() if s.kind == "resources" and n in urls]
    asks = [(name, url) for name in names for url in urls[name]]
    said = await asyncio.gather(*(ask_fingerprint(client, name, url) for name, url in asks))
    for (name, _), print_ in zip(asks, said, strict=True):
        if print_.get("id") is None and config.servers[name].impl is None:
            print_["unknown"] += (
                "; it is given by url: and was not started by rollgym (an OpenEnv server, "
                "another framework's): only a server that serves /fingerprint can say what "
                "scores its rollouts"
            )
    found: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    index: dict[str, int] = {}
    for (name, _), print_ in zip(asks, said, strict=True):
        replica = index[name] = index.get(name, -1) + 1
        if name not in found:
            found[name] = print_
            if print_.get("id") is None:
                warnings.append(
                    f"server {name}: {print_.get('unknown')}: which environment scored its "
                    "rollouts is not recorded (its records carry no rollgym_fingerprint)"
                )
        elif print_.get("id") != found[name].get("id"):
            warnings.append(
                f"server {name}: replica {replica} is scored by another environment than "
                f"replica 0 (fingerprint {print_.get('id')}, not {found[name].get('id')})"
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
