"""Weight sync (``rollgym.integrations.weights``): ``LocalModelWeights`` against the real CPU
backend on 127.0.0.1; its bounds against servers that hang, fail or refuse; and
``VllmWeights`` against the vLLM-shaped double (``tests/models/vllm_double.py``: vLLM 0.32's
development endpoints and their failure modes) behind ``openai_proxy``: the calls and their
order, the checks before a push, the restore after a failed one, ``/resume`` retried, and the
version every later call records. ``tests/models/test_vllm_weights_real.py`` does it on a real
vLLM (opt-in)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rollgym.errors import (
    BadCheckpoint,
    DeadlineExceeded,
    HTTPStatusError,
    InvalidRequest,
    ReadTimeout,
    WeightsNotRestored,
)
from rollgym.integrations import weights as weights_module
from rollgym.integrations.weights import LocalModelWeights, VllmWeights, WeightSync
from rollgym.models.tiny import build_tiny_model
from rollgym.testing import bind_socket, serve_asgi, serve_server
from rollgym.wire import POLICY_VERSION
from tests.models.vllm_double import VllmDouble

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("models")
    return (
        build_tiny_model(root / "a", seed=0),
        build_tiny_model(root / "b", seed=1),
        build_tiny_model(root / "wide", hidden_size=64, num_heads=1),
    )


@asynccontextmanager
async def backend(model: Path) -> AsyncIterator[tuple[str, Any]]:
    options = {"model_dir": str(model)}
    async with serve_server("rollgym.models.local:LocalModel", name="m", options=options) as s:
        yield s


async def test_local_pushes_are_confirmed_ordered_and_checked(
    models: tuple[Path, Path, Path],
) -> None:
    a, b, wide = models
    async with backend(a) as (url, server):
        sync = LocalModelWeights(url, timeout=30)
        assert isinstance(sync, WeightSync) and sync.version is None
        pushed = await sync.push(b, 1)
        assert (pushed.version, pushed.previous, pushed.path) == (1, 0, str(b))
        assert sync.version == 1 == server.engine.policy_version
        # From synchronous code (a trainer's step; here on a thread: this loop serves the
        # backend, which a blocking call in it would stall).
        assert (await asyncio.to_thread(sync.push_sync, a, 2)).version == 2
        assert server.health()[POLICY_VERSION] == 2
        # On this thread a loop runs: blocking it for the push's deadline is refused.
        with pytest.raises(RuntimeError, match="await push"):
            sync.push_sync(a, 3)
        # Stale: refused here, before anything is sent.
        with pytest.raises(InvalidRequest) as stale:
            await sync.push(b, 2)
        assert stale.value.status == 409 and "stale" in stale.value.message
        # Another trainer process that does not know: the server refuses it, not retried.
        other = LocalModelWeights(url, timeout=30)
        with pytest.raises(HTTPStatusError) as refused:
            await other.push(b, 1)
        assert refused.value.status == 409 and refused.value.attempts == 1
        assert other.version is None
        # The version and path served, pushed again (a retry that had landed): confirmed.
        assert (await other.push(a, 2)).version == 2
        # Another architecture: 422 naming the tensor; the served weights stay.
        with pytest.raises(HTTPStatusError) as mismatch:
            await sync.push(wide, 3)
        assert mismatch.value.status == 422 and "tensor '" in (mismatch.value.body or "")
        assert sync.version == 2 == server.engine.policy_version
        # Errors are plain values: they pickle with their fields.
        again = pickle.loads(pickle.dumps(mismatch.value))
        assert (type(again), again.status, again.body) == (
            HTTPStatusError,
            422,
            mismatch.value.body,
        )


@asynccontextmanager
async def double(handler: Callable[[web.Request], Any]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = bind_socket()
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()
        sock.close()


async def test_a_server_that_never_answers_fails_the_push_in_bounded_time() -> None:
    calls = 0
    never = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await never.wait()
        return web.json_response({})

    async with double(hang) as url:
        sync = LocalModelWeights(url, timeout=0.3, attempts=2, deadline=5)
        async with asyncio.timeout(20):  # the bound under test is far below this
            with pytest.raises((ReadTimeout, DeadlineExceeded)) as hung:
                await sync.push("/nowhere", 1)
        never.set()  # let the hung handlers end: the double's shutdown waits for them
    assert hung.value.attempts == 2 and calls == 2
    assert sync.version is None


@pytest.mark.parametrize(("status", "attempts"), [(503, 3), (502, 3), (400, 1), (404, 1)])
async def test_transient_failures_are_retried_and_4xx_never(status: int, attempts: int) -> None:
    calls = 0

    async def fail(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.json_response({"error": "no"}, status=status)

    async with double(fail) as url:
        sync = LocalModelWeights(url, timeout=5, attempts=3)
        with pytest.raises(HTTPStatusError) as failed:
            await sync.push("/x", 1)
    assert failed.value.status == status
    assert failed.value.attempts == attempts == calls


# -- vLLM 0.32, through the vLLM-shaped double (tests/models/vllm_double.py) --------------------

QUICK = {"backoff_initial": 0.01, "backoff_max": 0.02, "budget": {"enabled": False}}


@asynccontextmanager
async def vllm_and_proxy(served: Path) -> AsyncIterator[tuple[VllmDouble, str, str]]:
    """The double serving the checkpoint ``served``, and ``openai_proxy`` in front of it;
    yields (double, its URL, the proxy's URL)."""
    double = VllmDouble()
    double.model_root = str(served)
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(serve_asgi(double.app))
        stack.callback(double.release.set)
        options = {"base_url": url + "/v1", "model": "toy", "upstream_retry": QUICK}
        proxy_url, _ = await stack.enter_async_context(
            serve_server("openai_proxy", name="model", options=options)
        )
        yield double, url, proxy_url


async def chat(proxy_url: str) -> tuple[int, Any]:
    body = {"messages": [{"role": "user", "content": "hello"}]}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
        http.post(proxy_url + "/v1/chat/completions", json=body) as answer,
    ):
        return answer.status, await answer.json()


async def test_a_vllm_push_reloads_checks_and_every_later_call_records_its_version(
    models: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _ = models
    async with vllm_and_proxy(a) as (vllm, url, proxy_url):
        status, before = await chat(proxy_url)
        assert status == 200 and before[POLICY_VERSION] == 0
        sync = VllmWeights(url + "/v1", model_servers=[proxy_url], timeout=5)
        monkeypatch.chdir(b.parent)  # a relative path is made absolute, never a hub id
        pushed = await sync.push(b.name, 1)
        assert (pushed.path, pushed.version, sync.version, sync.served) == (str(b), 1, 1, str(b))
        assert vllm.dev_calls == ["pause", f"reload {b}", "version 1", "resume"]
        assert vllm.weight_version == "1" and not vllm.paused
        status, after = await chat(proxy_url)
        assert status == 200 and after[POLICY_VERSION] == 1
        # The next push is checked against what vLLM serves now (b), and back to a works.
        assert (await sync.push(a, 2)).previous == 1
        status, last = await chat(proxy_url)
        assert last[POLICY_VERSION] == 2 and vllm.served == str(a)


async def test_a_bad_checkpoint_is_refused_before_vllm_is_asked(
    models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    a, _, wide = models
    (tmp_path / "empty").mkdir()
    async with vllm_and_proxy(a) as (vllm, url, proxy_url):
        sync = VllmWeights(url, model_servers=proxy_url, timeout=5)
        for path, said in [
            (wide, "does not match the served model"),
            (tmp_path / "nowhere", "no checkpoint at"),
            (tmp_path / "empty", "not a checkpoint directory"),
            (a / "config.json", "is a file"),
        ]:
            with pytest.raises(BadCheckpoint) as refused:
                await sync.push(path, 1)
            assert said in refused.value.message, refused.value.message
        assert vllm.dev_calls == [] and sync.version is None
        status, answer = await chat(proxy_url)
        assert status == 200 and answer[POLICY_VERSION] == 0


async def test_a_mismatch_names_the_tensors_that_differ(models: tuple[Path, Path, Path]) -> None:
    a, _, wide = models
    async with vllm_and_proxy(a) as (vllm, url, _):
        with pytest.raises(BadCheckpoint) as refused:
            await VllmWeights(url, timeout=5).push(wide, 1)
    assert "tensor 'model." in refused.value.message and "the served one" in refused.value.message
    again = pickle.loads(pickle.dumps(refused.value))
    assert (type(again), again.message) == (BadCheckpoint, refused.value.message)
    assert vllm.dev_calls == []


async def test_a_failed_reload_leaves_vllm_serving_the_previous_weights(
    models: tuple[Path, Path, Path],
) -> None:
    a, b, _ = models
    async with vllm_and_proxy(a) as (vllm, url, proxy_url):
        vllm.fail_reloads = 1  # b looks right here, but vLLM fails to load it (a disk, say)
        sync = VllmWeights(url, model_servers=[proxy_url], timeout=5)
        with pytest.raises(HTTPStatusError) as failed:
            await sync.push(b, 1)
        assert failed.value.status == 500 and failed.value.attempts == 1
        assert vllm.dev_calls == ["pause", f"reload {b}", f"reload {a}", "resume"]
        assert not vllm.engine_broken and not vllm.paused and vllm.weight_version == "default"
        # vLLM answers (a broken engine would have died on this call), under the old version.
        status, answer = await chat(proxy_url)
        assert status == 200 and answer[POLICY_VERSION] == 0 and not vllm.died
        assert sync.version is None and sync.served is None


async def test_a_reload_that_cannot_be_undone_says_so(
    models: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _, wide = models
    # rollgym's check bypassed: vLLM loads the mismatch half-way, and then fails every reload.
    monkeypatch.setattr(weights_module, "_check_against", lambda *args: True)
    async with vllm_and_proxy(a) as (vllm, url, proxy_url):
        sync = VllmWeights(url, model_servers=[proxy_url], timeout=5)
        with pytest.raises(WeightsNotRestored) as broken:
            await sync.push(wide, 1)
        assert vllm.dev_calls == ["pause", f"reload {wide}", f"reload {a}", "resume"]
        assert vllm.engine_broken and not vllm.paused  # resumed all the same: it fails fast
        # The proxy was released at its version: it is not left holding every call.
        status, _ = await chat(proxy_url)
        assert status == 502 and vllm.died  # as vLLM 0.32: the broken engine kills it
    err = broken.value
    assert err.origin is not None and err.origin.type == "http_status"
    assert "restart it" in err.message and str(a) in err.message
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.origin.type) == (WeightsNotRestored, "http_status")  # type: ignore[union-attr]


@pytest.mark.parametrize("fail", [False, True])
async def test_resume_is_retried_on_fresh_connections_whatever_attempts_says(
    models: tuple[Path, Path, Path], fail: bool
) -> None:
    a, b, _ = models
    async with vllm_and_proxy(a) as (vllm, url, proxy_url):
        vllm.drop_resumes = 2  # vLLM cuts the connection of the first two /resume calls
        vllm.fail_reloads = int(fail)
        sync = VllmWeights(url, model_servers=[proxy_url], timeout=5, attempts=1)
        if fail:
            with pytest.raises(HTTPStatusError):
                await sync.push(b, 1)
        else:
            assert (await sync.push(b, 1)).version == 1
        assert vllm.dev_calls.count("resume") == 3 and not vllm.paused
        status, answer = await chat(proxy_url)
        assert status == 200 and answer[POLICY_VERSION] == (0 if fail else 1)


async def test_a_resume_never_acknowledged_is_a_typed_error(
    models: tuple[Path, Path, Path],
) -> None:
    a, b, _ = models
    async with vllm_and_proxy(a) as (vllm, url, _):
        vllm.drop_resumes = 10**6
        sync = VllmWeights(url, timeout=5, resume_within=0.5)
        with pytest.raises(WeightsNotRestored) as stuck:
            await sync.push(b, 1)
        vllm.drop_resumes = 0
    assert "did not acknowledge POST /resume" in stuck.value.message
    assert vllm.paused and sync.version is None


async def test_the_double_dies_as_vllm_does_after_a_failed_reload(tmp_path: Path) -> None:
    # What the restore above prevents: vLLM 0.32 left with a half-loaded engine by a failed
    # reload dies on its next request (seen on the real one: 500, then the server exits).
    double = VllmDouble()
    async with (
        serve_asgi(double.app) as url,
        # A connection per request: vLLM drops the one it answered the failed reload on.
        aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=10),
            connector=aiohttp.TCPConnector(force_close=True),
        ) as http,
    ):
        reload = {"method": "reload_weights", "kwargs": {"weights_path": "relative/ckpt"}}
        async with http.post(url + "/collective_rpc", json=reload) as answer:
            assert answer.status == 500 and "Repo id must be" in (await answer.text())
        body = {"messages": [{"role": "user", "content": "hello"}]}
        async with http.post(url + "/v1/chat/completions", json=body) as answer:
            assert answer.status == 500
        with pytest.raises(aiohttp.ClientError):
            async with http.get(url + "/weight_info") as answer:
                await answer.read()
    assert double.died


def test_a_vllm_sync_naming_no_model_servers_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Its records would say "policy versions [0]" after every push, silently.
    monkeypatch.setattr(weights_module, "_unnamed_warned", False)
    with caplog.at_level("WARNING", logger="rollgym.integrations.weights"):
        VllmWeights("http://vllm:8000")
        VllmWeights("http://vllm:8000")
        VllmWeights("http://vllm:8000", model_servers=["http://proxy:8001"])
    [warning] = [r.getMessage() for r in caplog.records]
    assert "names no model_servers" in warning
    assert "records keep the version they had" in warning
    assert "Pass model_servers=[...]" in warning
