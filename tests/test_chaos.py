"""The chaos proxy: every fault kind, seeded decisions, and the `rollgym chaos` command."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.chaos import ChaosProxy, chaos_proxy
from rollgym.config import RetryPolicy
from rollgym.errors import ConnectionLost, HTTPStatusError, ProtocolError, ReadTimeout
from rollgym.http import HttpClient, Target
from rollgym.testing import serve_asgi
from rollgym.wire import HEADER_ROLLOUT

pytestmark = pytest.mark.timeout(30)

ONCE = RetryPolicy(max_attempts=1, attempt_timeout=5.0)


@asynccontextmanager
async def upstream() -> AsyncIterator[tuple[str, Counter[str]]]:
    hits: Counter[str] = Counter()

    async def work(request: Request) -> JSONResponse:
        hits[request.url.path] += 1
        return JSONResponse({"ok": True, "padding": "x" * 200})

    app = Starlette(routes=[Route("/work", work, methods=["POST"])])
    async with serve_asgi(app) as url:
        yield url, hits


@asynccontextmanager
async def behind(spec: dict[str, Any]) -> AsyncIterator[tuple[str, ChaosProxy, Counter[str]]]:
    async with (
        upstream() as (url, hits),
        chaos_proxy(url, spec, name="model") as (proxy_url, proxy),
    ):
        yield proxy_url, proxy, hits


async def call(url: str, policy: RetryPolicy = ONCE, rollout: str | None = None) -> Any:
    headers = {HEADER_ROLLOUT: rollout} if rollout else None
    async with HttpClient() as client:
        return await client.call(Target.single("model", url, policy), "/work", {}, headers=headers)


async def test_status_fault_answers_a_rollgym_error_body_and_never_forwards() -> None:
    async with behind({"faults": [{"kind": "status", "status": 503, "rate": 1.0}]}) as (
        url,
        proxy,
        hits,
    ):
        with pytest.raises(HTTPStatusError) as info:
            await call(url)
    assert info.value.status == 503 and "injected 503" in (info.value.body or "")
    assert hits["/work"] == 0 and proxy.stats()["injected"] == {"503": 1}


async def test_429_with_retry_after_is_honoured_by_a_policy_that_lists_it() -> None:
    spec = {"faults": [{"kind": "status", "status": 429, "rate": 1.0, "retry_after": 1}]}
    policy = RetryPolicy(max_attempts=2, retry_4xx=(429,), backoff_initial=0.01)
    async with behind(spec) as (url, _, hits):
        started = time.monotonic()
        with pytest.raises(HTTPStatusError) as info:
            await call(url, policy)
        elapsed = time.monotonic() - started
    assert info.value.status == 429 and info.value.attempts == 2
    assert elapsed >= 1.0  # waited for Retry-After between the two attempts
    assert hits["/work"] == 0


async def test_reset_before_drops_the_request_unforwarded_and_reset_after_forwards_it() -> None:
    async with behind({"faults": [{"kind": "reset_before", "rate": 1.0}]}) as (url, _, hits):
        with pytest.raises(ConnectionLost):
            await call(url)
        assert hits["/work"] == 0
    async with behind({"faults": [{"kind": "reset_after", "rate": 1.0}]}) as (url, _, hits):
        with pytest.raises(ConnectionLost):
            await call(url)
        assert hits["/work"] == 1  # its side effect happened: replay only if idempotent


async def test_delay_and_hang() -> None:
    async with behind({"faults": [{"kind": "delay", "rate": 1.0, "seconds": 0.5}]}) as (
        url,
        _,
        hits,
    ):
        started = time.monotonic()
        assert (await call(url))["ok"] is True
        assert time.monotonic() - started >= 0.5
    policy = RetryPolicy(max_attempts=1, attempt_timeout=0.5)
    async with behind({"faults": [{"kind": "hang", "rate": 1.0}]}) as (url, _, hits):
        with pytest.raises(ReadTimeout):
            await call(url, policy)
        assert hits["/work"] == 0


@pytest.mark.parametrize("kind", ["malformed_json", "truncated_json"])
async def test_bad_json_is_a_protocol_error(kind: str) -> None:
    async with behind({"faults": [{"kind": kind, "rate": 1.0}]}) as (url, _, _hits):
        with pytest.raises(ProtocolError):
            await call(url)


async def test_a_sequence_scripts_the_first_answers_then_rates_apply() -> None:
    async with behind({"sequence": [503, "ok", 500]}) as (url, _, hits):
        outcomes: list[object] = []
        for _ in range(4):
            try:
                await call(url)
                outcomes.append("ok")
            except HTTPStatusError as err:
                outcomes.append(err.status)
    assert outcomes == [503, "ok", 500, "ok"]
    assert hits["/work"] == 2  # only the "ok" ones were forwarded


async def test_decisions_depend_on_the_rollout_not_the_arrival_order() -> None:
    spec = {"seed": 42, "faults": [{"kind": "status", "status": 503, "rate": 0.5}]}
    ids = [f"{t}:0" for t in range(30)]

    async def outcomes(order: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        async with behind(spec) as (url, _, _hits):
            for rid in order:
                try:
                    await call(url, rollout=rid)
                    out[rid] = "ok"
                except HTTPStatusError:
                    out[rid] = "503"
        return out

    first = await outcomes(ids)
    second = await outcomes(list(reversed(ids)))
    assert first == second
    assert 5 < list(first.values()).count("503") < 25  # about half


async def test_rollgym_chaos_command_proxies_and_stops_on_sigterm(tmp_path: Path) -> None:
    spec = tmp_path / "faults.yaml"
    spec.write_text("seed: 1\nsequence: [503]\n")
    async with upstream() as (up, hits):
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "rollgym"), "chaos", up, "--spec", str(spec),
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
            url = line.strip().rsplit(" ", 1)[-1]
            assert url.startswith("http://127.0.0.1:"), line
            with pytest.raises(HTTPStatusError):
                await call(url)
            assert (await call(url))["ok"] is True
            assert hits["/work"] == 1
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0
    assert "'503': 1" in out.decode()
