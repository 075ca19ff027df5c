"""Recall on planted flaws: every flaw found with its class, no hardened twin flagged; each
environment served both as a rollgym Python server and as a foreign starlette app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.audit.play import ServerAudit, audit_server
from rollgym.audit.target import Environment
from rollgym.http import HttpClient
from rollgym.testing import serve_asgi, serve_server
from tests.audit.planted import FLAWS, HARDENED, Flaw, foreign_app, python_server, release

pytestmark = pytest.mark.timeout(300)

TIMEOUT = 5.0
"""Seconds per call: a planted hang never answers; every other verify takes milliseconds."""


@asynccontextmanager
async def served(flaw: Flaw, kind: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The flaw's server on 127.0.0.1 (port 0): its URL and its state."""
    if kind == "python":
        async with serve_server(python_server(flaw), name=flaw.name) as (url, server):
            yield url, server.state  # type: ignore[attr-defined]
    else:
        app = foreign_app(flaw)
        async with serve_asgi(app) as url:
            yield url, app.state.planted


async def audit(flaw: Flaw, kind: str) -> ServerAudit:
    async with served(flaw, kind) as (url, state), HttpClient() as http:
        try:
            env = Environment(http, flaw.name, url, timeout=TIMEOUT)
            return await audit_server(env, flaw.rows)
        finally:
            release(state)


@pytest.mark.parametrize("kind", ["python", "foreign"])
@pytest.mark.parametrize("flaw", FLAWS, ids=lambda f: f.name)
async def test_a_planted_flaw_is_found_with_its_class(flaw: Flaw, kind: str) -> None:
    result = await audit(flaw, kind)
    classes = {f.cls for f in result.findings}
    assert flaw.cls in classes, result.to_dict()
    expected = "unreliable" if flaw.cls in ("crash", "nondeterministic") else "exploitable"
    assert result.verdict == expected, result.to_dict()


@pytest.mark.parametrize("kind", ["python", "foreign"])
@pytest.mark.parametrize("flaw", HARDENED, ids=lambda f: f.name)
async def test_a_hardened_twin_is_clean(flaw: Flaw, kind: str) -> None:
    result = await audit(flaw, kind)
    assert result.verdict == "clean", result.to_dict()
    assert result.skipped == 0


async def test_a_server_that_scores_no_play_is_unaudited_not_clean() -> None:
    # An OpenEnv app answers rollgym's /reset and /step bodies 422 (it wants an action over
    # its /ws session): nothing was scored, so nothing is known.
    async def refuse(request: object) -> JSONResponse:
        return JSONResponse({"detail": "action: field required"}, status_code=422)

    app = Starlette(routes=[Route(p, refuse, methods=["POST"]) for p in ("/reset", "/step")])
    async with serve_asgi(app) as url, HttpClient() as http:
        result = await audit_server(
            Environment(http, "openenv", url, timeout=TIMEOUT), FLAWS[0].rows
        )
    assert result.verdict == "unaudited", result.to_dict()
    assert result.refused == result.plays > 0
