"""The policy gate on the CPU backend (``local_model``), served for real with a tiny model built
at test time: its calls carry the version of the weights that generated them, a weight push
raises the live version, and a pause holds its calls like any rollgym model server's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from rollgym.models.tiny import build_tiny_model
from rollgym.testing import serve_server
from rollgym.wire import (
    PAUSE_ENDPOINT,
    POLICY_ENDPOINT,
    POLICY_VERSION,
    REPLICA,
    RESUME_ENDPOINT,
    UPSTREAM_KEY,
    WEIGHTS_ENDPOINT,
)
from tests.support.waiting import wait_until

from .held_model import TIMEOUT, get, post

pytestmark = pytest.mark.timeout(120)

ASK = {"input": "hello", "temperature": 0, "max_output_tokens": 4}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=0)


async def test_the_cpu_backends_calls_carry_the_version_of_their_weights(tiny: Path) -> None:
    options = {"model_dir": str(tiny), "policy_version": 2}
    async with (
        serve_server("rollgym.models.local:LocalModel", name="model", options=options) as (
            url,
            model,
        ),
        aiohttp.ClientSession(timeout=TIMEOUT) as session,
    ):
        assert (await get(session, url + POLICY_ENDPOINT))["version"] == 2
        status, body = await post(session, url + "/v1/responses", ASK)
        assert status == 200, body
        entry = body[UPSTREAM_KEY]
        assert (entry[POLICY_VERSION], entry[REPLICA]) == (2, 0)
        assert body["output"][-1][POLICY_VERSION] == 2  # on its token data too

        # A weight push raises the live version: older resumes are then refused.
        status, pushed = await post(session, url + WEIGHTS_ENDPOINT,
                                    {"path": str(tiny), "version": 5})  # fmt: skip
        assert status == 200, pushed
        assert (await get(session, url + POLICY_ENDPOINT))["version"] == 5
        status, refused = await post(session, url + RESUME_ENDPOINT, {"version": 4})
        assert status == 409, refused

        # A pause holds its calls; released, a call records the weights that generated it
        # (the backend's own version), whatever version the resume named.
        await post(session, url + PAUSE_ENDPOINT, {"timeout_s": 60})
        call = asyncio.create_task(post(session, url + "/v1/responses", ASK))
        await wait_until(lambda: model.policy.held == 1, what="a held call")  # type: ignore[attr-defined]
        status, _ = await post(session, url + RESUME_ENDPOINT, {"version": 6})
        assert status == 200
        status, body = await call
        assert status == 200, body
        assert body[UPSTREAM_KEY][POLICY_VERSION] == 5
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, completion = await post(session, url + "/v1/chat/completions", chat)
        assert status == 200 and (completion[POLICY_VERSION], completion[REPLICA]) == (5, 0)
