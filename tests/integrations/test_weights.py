"""Weight sync (``rollgym.integrations.weights``): ``LocalModelWeights`` against the real CPU
backend on 127.0.0.1; its bounds against servers that hang, fail or refuse; and
``VllmWeights`` against a small aiohttp double of vLLM 0.32's development endpoints
(``/pause``, ``/collective_rpc``, ``/update_weight_version``, ``/resume``): the double checks
the calls and their order, not that vLLM reloads (that needs a real vLLM; not run here)."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rollgym.errors import (
    DeadlineExceeded,
    HTTPStatusError,
    InvalidRequest,
    ReadTimeout,
    RollgymError,
)
from rollgym.integrations.weights import LocalModelWeights, VllmWeights, WeightSync
from rollgym.models.tiny import build_tiny_model
from rollgym.testing import bind_socket, serve_server
from rollgym.wire import POLICY_VERSION

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


class FakeVllm:
    """vLLM 0.32's development endpoints, as far as a push uses them."""

    def __init__(self, fail_rpc: int | None = None, fail_pause: int | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_rpc = fail_rpc
        self.fail_pause = fail_pause
        self.paused = False
        self.version: str | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.path, request.query_string, body))
        if request.path == "/pause":
            self.paused = True  # vLLM holds new requests before its answer is known
            if self.fail_pause:
                return web.json_response({"error": "pause failed"}, status=self.fail_pause)
            return web.json_response({"status": "paused"})
        if request.path == "/resume":
            self.paused = False
            return web.json_response({"status": "resumed"})
        if request.path == "/collective_rpc":
            assert self.paused, "weights reloaded while generating"
            if self.fail_rpc:
                return web.json_response({"error": "reload failed"}, status=self.fail_rpc)
            return web.json_response({"results": [None]})
        if request.path == "/update_weight_version":
            self.version = body["new_version"]
            return web.json_response({"success": True, "new_version": self.version})
        return web.json_response({"detail": "Not Found"}, status=404)


async def test_vllm_push_pauses_reloads_records_and_resumes() -> None:
    vllm = FakeVllm()
    async with double(vllm.handle) as url:
        sync = VllmWeights(url + "/v1", timeout=5)  # the OpenAI base URL works too
        pushed = await sync.push("/ckpt/step-7", 7)
    assert pushed.version == 7 == sync.version
    assert vllm.calls == [
        ("/pause", "mode=wait", {}),
        ("/collective_rpc", "", {"method": "reload_weights",
                                 "kwargs": {"weights_path": "/ckpt/step-7"}}),
        ("/update_weight_version", "", {"new_version": "7"}),
        ("/resume", "", {}),
    ]  # fmt: skip
    assert vllm.version == "7" and not vllm.paused


async def test_a_failed_vllm_reload_still_resumes_and_is_typed() -> None:
    vllm = FakeVllm(fail_rpc=400)
    async with double(vllm.handle) as url:
        sync = VllmWeights(url, timeout=5)
        with pytest.raises(HTTPStatusError) as failed:
            await sync.push("/ckpt/bad", 1)
    assert failed.value.status == 400 and failed.value.attempts == 1
    assert isinstance(failed.value, RollgymError)
    assert [c[0] for c in vllm.calls] == ["/pause", "/collective_rpc", "/resume"]
    assert not vllm.paused and sync.version is None


async def test_a_pause_that_fails_is_still_resumed() -> None:
    # vLLM may be paused although its /pause answer was an error (or never came): resume it.
    vllm = FakeVllm(fail_pause=400)
    async with double(vllm.handle) as url:
        sync = VllmWeights(url, timeout=5)
        with pytest.raises(HTTPStatusError):
            await sync.push("/ckpt/x", 1)
    assert [c[0] for c in vllm.calls] == ["/pause", "/resume"]
    assert not vllm.paused and sync.version is None
