"""The scripted model's seeded long-tailed latency (``latency_dist``): its quantiles, its
determinism, its validation, and a pause's abort cutting a long draw short."""

from __future__ import annotations

import asyncio
import statistics

import aiohttp
import pytest

from rollgym.errors import ConfigError
from rollgym.models.latency import LatencyDist
from rollgym.models.scripted import ScriptedModel
from rollgym.testing import serve_server
from rollgym.wire import HEADER_ROLLOUT, PAUSE_ENDPOINT, RESUME_ENDPOINT
from tests.support.waiting import wait_until

from .held_model import TIMEOUT, post

pytestmark = pytest.mark.timeout(60)

LONG_TAIL = {"lognormal": {"median_s": 0.05, "p99_over_median": 30}, "seed": 7}


def test_draws_have_the_asked_median_and_p99_and_repeat_per_rollout_and_turn() -> None:
    dist = LatencyDist.model_validate(LONG_TAIL)
    draws = sorted(dist.draw(f"{i}:0", 0) for i in range(20000))
    median = statistics.median(draws)
    p99 = draws[int(0.99 * len(draws))]
    assert median == pytest.approx(0.05, rel=0.05)
    assert p99 / median == pytest.approx(30, rel=0.15)
    assert dist.draw("3:1", 2) == LatencyDist.model_validate(LONG_TAIL).draw("3:1", 2)
    assert dist.draw("3:1", 2) != dist.draw("3:1", 3)  # another turn, another draw
    other = LatencyDist.model_validate({**LONG_TAIL, "seed": 8})
    assert other.draw("3:1", 2) != dist.draw("3:1", 2)
    assert max(draws) <= 0.05 * dist.cap_over_median


@pytest.mark.parametrize(
    ("latency_dist", "needle"),
    [
        ({"lognormal": {"median_s": 0, "p99_over_median": 30}}, "median_s"),
        ({"lognormal": {"median_s": 1, "p99_over_median": 0.5}}, "p99_over_median"),
        ({"lognormal": {"median_s": 1}}, "p99_over_median"),
        ({"normal": {"median_s": 1}}, "normal"),
    ],
)
def test_a_bad_latency_dist_is_a_config_error_naming_the_key(
    latency_dist: dict[str, object], needle: str
) -> None:
    from rollgym.config import ServerConfig
    from rollgym.server.base import ServerContext

    config = ServerConfig(kind="model", impl="scripted", options={"latency_dist": latency_dist})
    with pytest.raises(ConfigError, match=needle):
        ScriptedModel(ServerContext(name="model", config=config))


async def test_a_pause_with_abort_cuts_a_long_draw_short_and_the_reissue_draws_again() -> None:
    # A median of a minute: the call is surely still sleeping when the pause aborts it.
    slow = {"lognormal": {"median_s": 60, "p99_over_median": 1.0}}
    options = {"latency_dist": slow}
    async with serve_server(ScriptedModel, name="model", options=options) as (
        url, model), aiohttp.ClientSession(timeout=TIMEOUT) as session:  # fmt: skip
        body = {"input": "hi", "metadata": {"rollgym_script": [{"say": "done"}]}}
        call = asyncio.create_task(
            post(session, url + "/v1/responses", body, {HEADER_ROLLOUT: "1:0"})
        )
        await wait_until(lambda: model.policy.in_flight == 1, what="the call sleeping")  # type: ignore[attr-defined]
        status, paused = await post(session, url + PAUSE_ENDPOINT, {"abort": True})
        assert (status, paused["aborted"], paused["held"], paused["in_flight"]) == (200, 1, 1, 0)
        # Resumed, it sleeps its minute again: stop it by pausing once more and going away.
        await post(session, url + RESUME_ENDPOINT, {"version": 1})
        await wait_until(lambda: model.policy.in_flight == 1, what="the call re-issued")  # type: ignore[attr-defined]
        call.cancel()
        await wait_until(lambda: model.policy.in_flight == 0, what="the call abandoned")  # type: ignore[attr-defined]
