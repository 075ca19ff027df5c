"""Red team: lookup answers and tool arguments a policy under training may try, against a real
server.

- Listing many registry values so the expected one is "contained" (after one lookup, any
  lookup): before, every such list scored 1.0; now an answer that also names another value of
  the expected one's kind, not named by the question, scores 0 (``several_candidates``).
- Keys that are huge or odd: answered as the tool's refusal (a 4xx the agent hands back to the
  model), never kept whole in the session or echoed back whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rollgym.envs.lookup.knowledge import PRODUCTS, TOWNS
from rollgym.envs.lookup.server import LookupEnv
from rollgym.testing import serve_server
from tests.envs.env_client import EnvClient

pytestmark = pytest.mark.timeout(60)


def _row(question: str, expected: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": question}, "expected_answer": expected}


POPULATION = _row("How many people live in Brackenholt?", "48213")
MAYOR = _row("Who is the mayor of Tallowmere?", "Agnes Pellow")
REGION = _row("Which region is Serrowby in?", "Eastmarch")
PRICE = _row("What does QX-4471 cost, in euros?", 37)
EVERY_TOWN = "; ".join(f"{name}: {', '.join(map(str, t.values()))}" for name, t in TOWNS.items())
EVERY_PRODUCT = "; ".join(
    f"{code}: {', '.join(map(str, p.values()))}" for code, p in PRODUCTS.items()
)


async def _verify(env: EnvClient, row: dict[str, Any], text: str) -> dict[str, Any]:
    sid = await env.seed(row)
    status, _ = await env.call("lookup", {"key": "Velmora"}, sid)  # any lookup at all
    assert status == 200
    status, body = await env.verify(row, text, sid)
    assert status == 200, body
    return dict(body)


@pytest.mark.parametrize(
    ("row", "text"),
    [
        (POPULATION, " ".join(str(t["population"]) for t in TOWNS.values())),
        (POPULATION, "It is 48,213 or 9,317 or 2,764."),
        (POPULATION, EVERY_TOWN),
        (MAYOR, ", ".join(str(t["mayor"]) for t in TOWNS.values())),
        (MAYOR, EVERY_TOWN),
        (REGION, "Eastmarch, Saltreach, Highfold or Fenmoor"),
        (PRICE, " ".join(f"€{p['price_eur']}" for p in PRODUCTS.values())),
        (PRICE, EVERY_PRODUCT),
    ],
)
async def test_an_answer_listing_candidates_scores_0(
    connect: Callable[[str], EnvClient], row: dict[str, Any], text: str
) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        body = await _verify(env, row, text)
        assert (body["reward"], body["reason"]) == (0.0, "several_candidates")
        assert (await env.request("GET", "/health"))[0] == 200


@pytest.mark.parametrize(
    ("row", "text"),
    [
        (POPULATION, "Brackenholt has a population of 48,213 (founded 1742, Eastmarch)."),
        (MAYOR, "The mayor of Tallowmere is Agnes Pellow."),
        (_row("Which town has more inhabitants, Velmora or Serrowby?", "Velmora"),
         "Velmora (9,317) has more inhabitants than Serrowby (3,958)."),
        (_row("Who is the mayor of the town where LM-3310 is warehoused?", "Lucan Trevis"),
         "LM-3310 is stocked in Quillon, whose mayor is Lucan Trevis."),
    ],
)  # fmt: skip
async def test_an_answer_that_explains_itself_still_scores(
    connect: Callable[[str], EnvClient], row: dict[str, Any], text: str
) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        assert (await _verify(connect(url), row, text))["reward"] == 1.0


@pytest.mark.parametrize(
    "key", ["B" * 5_000_000, "\x00\x01", "\u202eBrackenholt", "../verify", "Bracken" * 20]
)
async def test_odd_keys_are_refused_by_the_tool(
    connect: Callable[[str], EnvClient], key: str
) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        sid = await env.seed(POPULATION)
        status, body = await env.call("lookup", {"key": key}, sid)
        assert status == 404, body
        assert len(body["error"]["message"]) < 1000  # the key is not echoed back whole
        assert (await env.request("GET", "/health"))[0] == 200
