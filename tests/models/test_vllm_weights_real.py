"""Opt-in: weight sync (``VllmWeights``) with a REAL vLLM 0.32 on this CPU, started with
``VLLM_SERVER_DEV_MODE=1``, serving the tiny random Llama of ``test_vllm_real`` (built here,
nothing downloaded), behind ``openai_proxy``. It pushes a perturbed copy of the model (by a
relative path) and checks that vLLM generates with it and that every later call records the
trainer's version; it pushes broken checkpoints (a shape mismatch, a missing path: refused
before vLLM is asked) and one that vLLM itself fails to load (a file cut short), and checks
that vLLM still answers with the previous weights: the same greedy tokens, the same checksums
(its ``/weight_checker``), the same version. Last, the mismatch with rollgym's check bypassed:
vLLM 0.32 fails it half-loaded and can then reload nothing (left alone, its next request
kills it): the push raises ``WeightsNotRestored``.

Skipped unless ``ROLLGYM_REAL_SERVER=1`` and ``ROLLGYM_VLLM_PYTHON`` (see ``test_vllm_real``)::

    ROLLGYM_REAL_SERVER=1 ROLLGYM_VLLM_PYTHON=/tmp/vllm/bin/python \\
        .venv/bin/pytest -q tests/models/test_vllm_weights_real.py
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollgym.errors import BadCheckpoint, HTTPStatusError, WeightsNotRestored
from rollgym.integrations import weights as weights_module
from rollgym.integrations.weights import VllmWeights
from rollgym.testing import serve_server
from rollgym.wire import POLICY_VERSION, UPSTREAM_KEY

from .vllm_real_support import make_model, real_vllm, serve_vllm

pytestmark = [real_vllm, pytest.mark.timeout(600)]


def copy_model(source: Path, out: Path, change: str) -> Path:
    """``source`` copied to ``out``, its tensors changed: ``perturb`` adds noise to every
    one; ``lm_head`` gives ``lm_head.weight`` 8 more rows (another vocabulary size)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    tensors = load_file(out / "model.safetensors")
    if change == "perturb":
        gen = torch.Generator().manual_seed(1)
        tensors = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in tensors.items()}
    else:
        head = tensors["lm_head.weight"]
        tensors["lm_head.weight"] = torch.zeros(head.shape[0] + 8, head.shape[1])
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    """The tiny model, a perturbed copy, one with another vocabulary size, and one whose
    file is cut short (its header intact)."""
    root = tmp_path_factory.mktemp("weights")
    tiny = make_model(root / "tiny")
    torn = shutil.copytree(tiny, root / "torn")
    file = torn / "model.safetensors"
    with file.open("r+b") as f:
        f.truncate(file.stat().st_size // 2)
    step1 = copy_model(tiny, root / "step-1", "perturb")
    return tiny, step1, copy_model(tiny, root / "bad", ""), torn


@pytest.fixture(scope="module")
def vllm_url(models: tuple[Path, Path, Path, Path]) -> Iterator[str]:
    tiny = models[0]
    dev = {"VLLM_SERVER_DEV_MODE": "1"}  # /pause, /resume, /collective_rpc, /weight_info ...
    with serve_vllm(tiny, tiny.parent / "vllm.log", env=dev) as served:
        yield served.url


async def generate(proxy_url: str) -> tuple[list[int], int]:
    """A greedy call through the proxy: (the generated ids, the version it recorded)."""
    body = {"input": "hello world", "max_output_tokens": 8, "temperature": 0}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        http.post(proxy_url + "/v1/responses", json=body) as answer,
    ):
        data = await answer.json()
        assert answer.status == 200, data
    return data["output"][-1]["generation_token_ids"], data[UPSTREAM_KEY][POLICY_VERSION]


async def vllm_state(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with http.post(url + "/weight_checker", json={"action": "checksum"}) as answer:
            checksums = (await answer.json())["checksums"]
        async with http.get(url + "/weight_info") as answer:
            version = (await answer.json())["weight_version"]
        async with http.get(url + "/is_paused") as answer:
            paused = (await answer.json())["is_paused"]
    return {"checksums": checksums, "version": version, "paused": paused}


async def vllm_is_paused(url: str) -> bool:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
        http.get(url + "/is_paused") as answer,
    ):
        return bool((await answer.json())["is_paused"])


async def test_weight_sync_with_a_real_vllm(
    vllm_url: str, models: tuple[Path, Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny, step1, bad, torn = models
    options = {"base_url": vllm_url + "/v1", "model": "tiny", "return_token_ids": True}
    async with serve_server("openai_proxy", name="model", options=options) as (proxy_url, _):
        ids0, version = await generate(proxy_url)
        assert version == 0
        sync = VllmWeights(vllm_url, model_servers=[proxy_url], timeout=120, attempts=1)
        monkeypatch.chdir(step1.parent)  # a relative path: made absolute, never a hub id
        pushed = await sync.push("step-1", 1)
        assert pushed.path == str(step1) and sync.version == 1
        ids1, version = await generate(proxy_url)
        assert version == 1 and ids1 != ids0  # the new weights, recorded as version 1
        before = await vllm_state(vllm_url)
        assert before["version"] == "1" and not before["paused"]

        # Refused before vLLM is asked: another shape, a path that is not there.
        with pytest.raises(BadCheckpoint, match=r"lm_head\.weight"):
            await sync.push(bad, 2)
        with pytest.raises(BadCheckpoint, match="no checkpoint at"):
            await sync.push(step1.parent / "step-9", 2)

        # vLLM itself fails the reload (a file cut short: its header passes the check): 500,
        # and the previous checkpoint is reloaded, so that vLLM serves on.
        with pytest.raises(HTTPStatusError) as failed:
            await sync.push(torn, 2)
        assert failed.value.status == 500
        after = await vllm_state(vllm_url)
        assert after == before  # the same weights, version 1, not paused
        assert await generate(proxy_url) == (ids1, 1)
        assert sync.version == 1 and sync.served == str(step1)

        # And on: the original weights as version 2.
        await sync.push(tiny, 2)
        assert await generate(proxy_url) == (ids0, 2)

        # Last (it breaks this vLLM): the mismatch with rollgym's check bypassed. vLLM 0.32
        # fails it half-loaded, and then fails every reload (its layerwise reload replays the
        # bad tensor): nothing brings it back, and the push says so.
        monkeypatch.setattr(weights_module, "_check_against", lambda *a: True)
        with pytest.raises(WeightsNotRestored, match="restart it") as lost:
            await sync.push(bad, 3)
        assert lost.value.origin is not None and lost.value.origin.status == 500
        assert not (await vllm_is_paused(vllm_url))  # resumed all the same: it fails fast
    print(
        f"\nreal vLLM: version 0 ids {ids0}; pushed step-1 as 1 in {pushed.seconds:.2f}s: "
        f"ids {ids1}; a failed reload left it on version 1 with the same "
        f"{len(after['checksums'])} checksums"
    )
