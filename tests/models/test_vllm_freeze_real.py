"""Opt-in: ``openai_proxy``'s liveness and progress watch (``rollgym.models.liveness``,
``rollgym.models.progress``) against a REAL vLLM 0.32 on this CPU, serving the tiny random Llama
of ``vllm_real_support`` (built here, nothing downloaded), with the proxy's default options
unless a test says otherwise:

1. a slow but progressing generation (``stall_timeout`` shortened to 5 s, the call sized from
   the measured tokens/s to run about 3 times that) completes, not cut;
2. vLLM's engine frozen alone (``SIGSTOP`` of its ``EngineCore`` process): its API server still
   answers ``POST /ping`` (200) and ``GET /metrics`` (the token counters standing still with the
   requests running), and the calls in flight fail as ``replica_stalled``;
   the same for an engine stopped between calls (its gauges still say idle: the engine
   reports them itself) with a call sent to it then;
3. vLLM frozen whole (``SIGSTOP`` of its API server and every process under it) in the middle of
   a real ``rollgym run`` (200 rollouts at concurrency 64: echo environment, ``tool_agent``):
   the run ends by itself, aborted, its failures typed ``replica_down`` / ``circuit_open``
   naming the probe, every rollout recorded at most once and the rest pending.

The seconds each takes are printed (``-s``), never asserted. vLLM is resumed (``SIGCONT``) in
a ``finally`` and stopped at the end of the module. Skipped unless ``ROLLGYM_REAL_SERVER=1`` and
``ROLLGYM_VLLM_PYTHON`` (see ``test_vllm_real``)::

    ROLLGYM_REAL_SERVER=1 ROLLGYM_VLLM_PYTHON=/tmp/vllm/bin/python \\
        .venv/bin/pytest -q -s tests/models/test_vllm_freeze_real.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import pytest

from rollgym.errors import root_record
from rollgym.models.progress import read_metrics
from rollgym.testing import serve_server
from tests.support.echo_run import recorded, write_echo_run
from tests.support.ledger import assert_recorded_once

from .vllm_real_support import Vllm, make_model, real_vllm, serve_vllm

pytestmark = [real_vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 4096  # room for a generation longer than a shortened stall_timeout
LONG = {"ignore_eos": True}  # the random model may say </s> at any token: not here


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    root = tmp_path_factory.mktemp("vllm-freeze")
    model = make_model(root / "tiny", positions=MAX_MODEL_LEN)
    # tool_agent sends the environment's tools: vLLM takes tool_choice "auto" only with a parser.
    args = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with serve_vllm(
        model, root / "vllm.log", max_model_len=MAX_MODEL_LEN, max_num_seqs=8, args=args
    ) as served:
        yield served


def engine_processes(vllm: Vllm) -> list[psutil.Process]:
    """vLLM's ``EngineCore`` process(es), among the API server's children."""
    found = [
        p
        for p in psutil.Process(vllm.pid).children(recursive=True)
        if "EngineCore" in p.name() or any("EngineCore" in a for a in p.cmdline()[:1])
    ]
    assert found, "no EngineCore process under vLLM's API server"
    return found


def signal_all(processes: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)


async def scrape(url: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.get(url + "/metrics") as answer,
    ):
        return answer.status, await answer.text()


async def ping(url: str) -> int:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(url + "/ping", json={}) as answer,
    ):
        return answer.status


def gauge(text: str, name: str) -> float:
    """The sum of a vLLM metric's samples (any labels) in a Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit("}", 1)[-1].split()[0])
    return total


async def call(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    """POST ``/v1/responses``: (status, body, seconds)."""
    start = time.monotonic()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=700)) as http,
        http.post(url + "/v1/responses", json=body) as answer,
    ):
        return answer.status, await answer.json(), time.monotonic() - start


async def generate_direct(url: str, tokens: int) -> float:
    """One call straight to vLLM generating ``tokens`` tokens: its tokens per second."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": tokens,
        **LONG,
    }
    start = time.monotonic()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http,
        http.post(url + "/v1/chat/completions", json=body) as answer,
    ):
        data = await answer.json()
        assert answer.status == 200, data
    assert data["usage"]["completion_tokens"] == tokens
    return tokens / (time.monotonic() - start)


async def test_a_slow_but_progressing_generation_is_not_cut(vllm: Vllm) -> None:
    stall = 5.0
    await generate_direct(vllm.url, 8)  # warm: the first call is slower
    rate = await generate_direct(vllm.url, 200)
    # Sized to run about 3 times the stall timeout at the rate just measured.
    tokens = min(max(200, int(rate * 3 * stall)), MAX_MODEL_LEN - 64)
    options = {"base_url": vllm.url + "/v1", "model": "tiny", "stall_timeout": stall,
               "extra_body": {**LONG, "min_tokens": tokens}}  # fmt: skip
    async with serve_server("openai_proxy", name="model", options=options) as (url, server):
        status, body, seconds = await call(
            url, {"input": "hello world", "max_output_tokens": tokens, "temperature": 1.0}
        )
        liveness = server.liveness  # type: ignore[attr-defined]
        scrapes, downs, hedges = liveness.scrapes, liveness.downs, liveness.hedges
    print(
        f"\nprogressing: vLLM generates {rate:.1f} tokens/s; a call of {tokens} tokens took "
        f"{seconds:.1f}s through the proxy (stall_timeout {stall:g}s, {scrapes} reads of "
        f"/metrics, {downs} replicas found down, {hedges} hedges)"
    )
    assert status == 200, body
    assert body["usage"]["output_tokens"] == tokens
    assert downs == 0
    # The counters were compared at least once (two reads a heartbeat, 5 s, apart: as long as
    # the stall timeout): the watch was on while the call ran, and let it go on.
    assert scrapes >= 2, "the call ended before the stall watch compared two readings"


async def test_an_engine_frozen_alone_is_typed_stalled(vllm: Vllm) -> None:
    options = {"base_url": vllm.url + "/v1", "model": "tiny", "extra_body": LONG}
    body = {"input": "hello world", "max_output_tokens": 3000, "temperature": 1.0}
    async with serve_server("openai_proxy", name="model", options=options) as (url, server):
        calls = [asyncio.ensure_future(call(url, body)) for _ in range(2)]
        try:
            # The engine holds both calls and generates (its counters move).
            before, deadline = -1.0, time.monotonic() + 300
            while True:
                assert time.monotonic() < deadline, "vLLM never ran both calls"
                _, text = await scrape(vllm.url)
                tokens = gauge(text, "vllm:generation_tokens_total")
                if gauge(text, "vllm:num_requests_running") >= 2 and 0 <= before < tokens:
                    break
                before = tokens
                assert not any(c.done() for c in calls), [c.result() for c in calls if c.done()]
                await asyncio.sleep(0.5)
            engines = engine_processes(vllm)
            signal_all(engines, signal.SIGSTOP)
            frozen = time.monotonic()
            try:
                # What vLLM 0.32's API server says while its engine is stopped.
                seen = []
                for _ in range(2):
                    await asyncio.sleep(1)  # outputs of its last step are counted first
                    status, text = await scrape(vllm.url)
                    reading = read_metrics(text)
                    seen.append((await ping(vllm.url), status, reading))
                    await asyncio.sleep(5)
                results = await asyncio.wait_for(asyncio.gather(*calls), timeout=300)
                typed = time.monotonic() - frozen
            finally:
                signal_all(engines, signal.SIGCONT)
        finally:
            for pending in calls:
                pending.cancel()
        downs = server.liveness.downs  # type: ignore[attr-defined]
    print(
        f"\nengine frozen (SIGSTOP of {[p.pid for p in engines]}): POST /ping, GET /metrics "
        f"and the reading while stopped: {seen}; both calls failed {typed:.1f}s after the "
        f"freeze (stall_timeout 45s, heartbeat 5s): "
        f"{[(s, b['error']['origin']['type'], round(t, 1)) for s, b, t in results]}"
    )
    # The API server answers its probe and its counters, standing still with requests running.
    assert [(p, s) for p, s, _ in seen] == [(200, 200), (200, 200)]
    first, second = seen[0][2], seen[1][2]
    assert first is not None and second is not None
    assert first.tokens == second.tokens and (first.busy or 0) >= 2
    assert downs >= 1
    for status, answer, _ in results:
        assert status == 504, answer
        origin = answer["error"]["origin"]
        assert origin["type"] == "replica_stalled", origin
        assert "made no progress" in origin["message"], origin
        assert "GET /metrics stood still" in origin["message"], origin
    # Resumed, vLLM serves again.
    assert await generate_direct(vllm.url, 8) > 0


async def test_an_engine_frozen_between_calls_is_typed_stalled(vllm: Vllm) -> None:
    options = {"base_url": vllm.url + "/v1", "model": "tiny"}
    body = {"input": "hello world", "max_output_tokens": 8}
    async with serve_server("openai_proxy", name="model", options=options) as (url, server):
        status, answer, _ = await call(url, body)
        assert status == 200, answer
        engines = engine_processes(vllm)
        signal_all(engines, signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            pending = asyncio.ensure_future(call(url, body))
            await asyncio.sleep(6)
            _, text = await scrape(vllm.url)
            reading = read_metrics(text)
            status, answer, _ = await asyncio.wait_for(pending, timeout=300)
            typed = time.monotonic() - frozen
        finally:
            signal_all(engines, signal.SIGCONT)
        downs = server.liveness.downs  # type: ignore[attr-defined]
    origin = answer["error"]["origin"] if status != 200 else {}
    print(
        f"\nengine frozen between calls: /metrics read {reading} with a call in flight; the "
        f"call failed {typed:.1f}s after the freeze: {status} {origin.get('type')}"
    )
    # vLLM's gauges are its engine's last report: idle, with the call waiting in front of it.
    assert reading is not None and reading.busy == 0
    assert status == 504, answer
    assert origin["type"] == "replica_stalled", origin
    assert "none in its engine by its last report" in origin["message"], origin
    assert downs == 1
    assert await generate_direct(vllm.url, 8) > 0


def test_vllm_frozen_whole_mid_run_ends_the_run(vllm: Vllm, tmp_path: Path) -> None:
    rollouts, concurrency, freeze_at = 200, 64, 20
    config = write_echo_run(
        tmp_path, vllm.url, rollouts, concurrency, model="tiny", max_output_tokens=16
    )
    out = tmp_path / "out"
    code = "import sys; from rollgym.cli.main import main; sys.argv[0] = 'rollgym'; main()"
    log = (tmp_path / "run.log").open("wb")
    run = subprocess.Popen(
        [sys.executable, "-c", code, "run", str(config), "--output", str(out)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "1000"},
    )  # fmt: skip
    frozen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 400
        while recorded(out) < freeze_at:
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{recorded(out)} rollouts recorded in 400s"
            time.sleep(0.1)
        server = psutil.Process(vllm.pid)
        frozen = [server, *server.children(recursive=True)]
        at = recorded(out)
        signal_all(frozen, signal.SIGSTOP)
        start = time.monotonic()
        try:
            returncode = run.wait(timeout=600)
            seconds = time.monotonic() - start
        finally:
            signal_all(frozen, signal.SIGCONT)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        log.close()
    run_json = orjson.loads((out / "run.json").read_bytes())
    counts = orjson.loads((out / "metrics.json").read_bytes())["counts"]
    abort = run_json.get("abort") or {}
    print(
        f"\nwhole vLLM frozen (SIGSTOP of {[p.pid for p in frozen]}) after {at} of {rollouts} "
        f"rollouts recorded (concurrency {concurrency}): the run ended {seconds:.1f}s later, "
        f"exit code {returncode}, {run_json['status']}; counts {counts}; "
        f"abort: {abort.get('reason')}"
    )
    assert run_json["status"] == "aborted", (tmp_path / "run.log").read_text()[-3000:]
    assert returncode == run_json["exit_code"] != 0
    assert set(abort["by_type"]) <= {"replica_down", "circuit_open"}, abort
    assert abort["by_server"].keys() == {"model.upstream"}
    assert "liveness probe (POST /ping: no answer within 5s)" in abort["sample_error"]["message"]

    ok, failures = assert_recorded_once(out)
    # Every rollout is recorded once or pending (--resume's), as the run's counts say.
    assert counts["total"] == rollouts
    assert (counts["succeeded"], counts["failed"]) == (len(ok), len(failures))
    assert counts["pending"] == rollouts - len(ok) - len(failures) > 0
    assert failures, "the calls in flight at the freeze fail, and are recorded"
    roots = [root_record(f["error"]) for f in failures]
    for root in roots:
        assert root["server"] == "model.upstream", root
        if root["type"] == "replica_down":
            # Failed by the heartbeat's probe, and not sent to the frozen replica again.
            assert "failed its liveness probe (POST /ping: no answer" in root["message"]
            assert root.get("attempts", 1) == 1  # the record leaves out one attempt
        else:
            # Refused by the replica's open breaker, which says what opened it.
            assert root["type"] == "circuit_open", root
            assert "POST /ping: no answer within 5s" in root["message"]
    assert "replica_down" in {root["type"] for root in roots}
