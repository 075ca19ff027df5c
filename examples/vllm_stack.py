"""The training stack of ``grpo_trl.py`` with vLLM serving the policy: vLLM 0.32 with
``VLLM_SERVER_DEV_MODE=1`` (its weight-sync endpoints: ``/pause``, ``/collective_rpc``,
``/update_weight_version``, ``/weight_info``, ``/resume``), ``openai_proxy`` with
``return_token_ids`` in front of it, an environment and rollgym's tool agent, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from rollgym.config import RetryPolicy, kind_defaults
from rollgym.http import Target
from rollgym.server.base import BaseServer
from rollgym.testing import serve_server

SERVED_NAME = "policy"


def start_vllm(python: str, model_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """vLLM on the CPU serving ``model_dir`` as ``policy``, with its development endpoints;
    returns once it is healthy (its log: ``model_dir/../vllm.log``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",  # the weight-sync endpoints VllmWeights uses
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "512", "--enforce-eager", "--dtype", "float32",
    ]  # fmt: skip
    log = (model_dir.parent / "vllm.log").open("wb")
    proc = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}: see {log.name}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2):
            return proc, url
        time.sleep(1)
    stop_vllm(proc)
    raise RuntimeError(f"vLLM not healthy after 300s: see {log.name}")


def stop_vllm(proc: subprocess.Popen[bytes]) -> None:
    """Stop vLLM and the engine processes it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@asynccontextmanager
async def vllm_rl_stack(
    model_dir: Path,
    env: str | type[BaseServer],
    *,
    python: str | None = None,
    url: str | None = None,
    env_name: str = "letters",
) -> AsyncIterator[tuple[str, str, str]]:
    """vLLM (started with ``python``, or the one at ``url``), the proxy, ``env`` and the
    agent; yields (agent URL, vLLM URL, proxy URL)."""

    def policy(kind: str) -> RetryPolicy:
        return RetryPolicy.model_validate(kind_defaults(kind))  # type: ignore[arg-type]

    async with AsyncExitStack() as stack:
        if url is None:
            if python is None:
                raise ValueError("vllm_rl_stack needs python= (to start vLLM) or url=")
            proc, url = start_vllm(python, model_dir)
            stack.callback(stop_vllm, proc)
        # A vLLM at ``url`` must serve the model as ``policy`` too (--served-model-name).
        options = {"base_url": f"{url}/v1", "return_token_ids": True, "model": SERVED_NAME}
        proxy, _ = await stack.enter_async_context(
            serve_server("openai_proxy", name="model", options=options)
        )
        env_url, _ = await stack.enter_async_context(serve_server(env, name=env_name))
        peers = {
            "model": Target.single("model", proxy, policy("model")),
            env_name: Target.single(env_name, env_url, policy("resources")),
        }
        agent, _ = await stack.enter_async_context(
            serve_server(
                "tool_agent",
                name="agent",
                options={"model": "model", "resources": env_name},
                peers=peers,
            )
        )
        yield agent, url, proxy
