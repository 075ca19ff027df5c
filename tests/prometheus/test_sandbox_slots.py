"""The code environment's ``/metrics``: its sandbox slots, those in use and the runs waiting."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from rollgym.envs.code.server import CodeEnv
from rollgym.testing import serve_server
from tests.envs.env_client import EnvClient

from .scrape import parse, value

pytestmark = pytest.mark.timeout(60)
# One slot; the weaker fallback is enough here (nothing hostile runs), so the test runs where
# namespaces are unavailable too.
OPTIONS = {"parallel": 1, "wall_seconds": 10.0, "require_namespaces": False}
ROW = {
    "responses_create_params": {"input": "solve"},
    "verifier_metadata": {"unit_tests": {"inputs": ["\n"], "outputs": ["done\n"]}},
}
SLOW = "My solution:\n```python\nimport time\ntime.sleep(2)\nprint('done')\n```"


async def test_slots_in_use_and_waiting_runs_are_shown() -> None:
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        serve_server(CodeEnv, name="code", options=OPTIONS) as (url, _),
        aiohttp.ClientSession(timeout=timeout) as http,
    ):
        client = EnvClient(http, url)
        latest: dict[str, float] = {}

        async def scrape() -> None:
            async with http.get(url + "/metrics") as resp:
                samples = parse(await resp.text())
            latest["in_use"] = value(samples, "rollgym_sandbox_slots_in_use")
            latest["waiting"] = value(samples, "rollgym_sandbox_runs_waiting")
            latest["slots"] = value(samples, "rollgym_sandbox_slots")

        await scrape()
        assert latest == {"in_use": 0, "waiting": 0, "slots": 1}
        # Two slow verifies on one slot: one runs, the other waits for it.
        verifies = [asyncio.create_task(client.verify(ROW, SLOW)) for _ in range(2)]
        seen: list[tuple[float, float]] = []

        async def both_seen() -> None:
            while (1, 1) not in seen:
                await scrape()
                seen.append((latest["in_use"], latest["waiting"]))
                await asyncio.sleep(0.02)

        await asyncio.wait_for(both_seen(), 20)
        answers = await asyncio.gather(*verifies)
        assert [status for status, _ in answers] == [200, 200], answers
        assert [body["reward"] for _, body in answers] == [1.0, 1.0]
        await scrape()
        assert latest == {"in_use": 0, "waiting": 0, "slots": 1}
