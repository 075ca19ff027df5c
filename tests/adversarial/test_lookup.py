"""Red team: lookup answers and tool arguments a policy under training may try, against a real
server.

- Listing many registry values so the expected one is "contained" (after one lookup, any
  lookup): before, every such list scored 1.0; now an answer that also names another value of
  the expected one's kind, not named by the question, scores 0 (``several_candidates``).
- The looked-up entry's fields all at once ("Eastmarch, 48213, 1742, Ilse Marrow"): before, 1.0
  for whichever field was asked; now an answer naming values of three other fields is a list
  (``several_candidates``), while one that explains itself with one or two still scores.
- A comparison answered with both of its candidates ("Velmora or Serrowby", "either Serrowby or
  Velmora"): before, 1.0 on every bundled comparison row; now 0, and no text pays for both
  choices of a comparison.
- A lookup of a key that does not exist, or of an entry that does not hold the answer, then a
  guess: before, ``tool_called`` 1 and reward 1.0; now a source must have returned the value.
- Keys that are huge or odd: answered as the tool's refusal (a 4xx the agent hands back to the
  model), never kept whole in the session or echoed back whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollgym.envs.lookup.knowledge import PRODUCTS, TOWNS
from rollgym.envs.lookup.server import LookupEnv
from rollgym.testing import serve_server
from tests.envs.env_client import EnvClient

pytestmark = pytest.mark.timeout(60)


def _row(question: str, expected: Any, *keys: str) -> dict[str, Any]:
    """A row, and (as ``lookups``) the keys whose entries hold its answer."""
    return {
        "responses_create_params": {"input": question},
        "expected_answer": expected,
        "lookups": list(keys),
    }


POPULATION = _row("How many people live in Brackenholt?", "48213", "Brackenholt")
MAYOR = _row("Who is the mayor of Tallowmere?", "Agnes Pellow", "Tallowmere")
REGION = _row("Which region is Serrowby in?", "Eastmarch", "Serrowby")
PRICE = _row("What does QX-4471 cost, in euros?", 37, "QX-4471")
COMPARISON = _row(
    "Which town has more inhabitants, Velmora or Serrowby?", "Velmora", "Velmora", "Serrowby"
)
DATA = Path(__file__).parents[2] / "src/rollgym/envs/lookup/data/example.jsonl"
EVERY_TOWN = "; ".join(f"{name}: {', '.join(map(str, t.values()))}" for name, t in TOWNS.items())
EVERY_PRODUCT = "; ".join(
    f"{code}: {', '.join(map(str, p.values()))}" for code, p in PRODUCTS.items()
)


async def _verify(
    env: EnvClient, row: dict[str, Any], text: str, keys: list[str] | None = None
) -> dict[str, Any]:
    sent = {k: v for k, v in row.items() if k != "lookups"}
    sid = await env.seed(sent)
    for key in row["lookups"] if keys is None else keys:
        status, _ = await env.call("lookup", {"key": key}, sid)
        assert status == 200
    status, body = await env.verify(sent, text, sid)
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
        # The looked-up entry's every field at once pays for whichever was asked (found by
        # rollgym audit: 21 of the 26 example rows paid 1.0 before).
        (POPULATION, ", ".join(str(v) for k, v in TOWNS["Brackenholt"].items() if k != "kind")),
        (MAYOR, ", ".join(str(v) for k, v in TOWNS["Tallowmere"].items() if k != "kind")),
        (REGION, ", ".join(str(v) for k, v in TOWNS["Serrowby"].items() if k != "kind")),
        (PRICE, ", ".join(str(v) for k, v in PRODUCTS["QX-4471"].items() if k != "kind")),
        # Twice over: the asked value comes again, but not after the others.
        (POPULATION, "; ".join([", ".join(str(v) for v in TOWNS["Brackenholt"].values())] * 2)),
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
        (COMPARISON, "Velmora (9,317) has more inhabitants than Serrowby (3,958)."),
        (COMPARISON, "More people live in Velmora than in Serrowby."),
        (COMPARISON, "Velmora."),
        (COMPARISON, "Velmora has more inhabitants (9,317) compared to Serrowby (3,958)."),
        (COMPARISON, "Velmora, not Serrowby."),
        (COMPARISON, "Velmora has 9,317 inhabitants, while Serrowby has 3,958."),
        (_row("Who is the mayor of the town where LM-3310 is warehoused?", "Lucan Trevis",
              "LM-3310", "Quillon"),
         "LM-3310 is stocked in Quillon, whose mayor is Lucan Trevis."),
        (POPULATION, f"The entry says {TOWNS['Brackenholt']}, so the answer is 48213."),
    ],
)  # fmt: skip
async def test_an_answer_that_explains_itself_still_scores(
    connect: Callable[[str], EnvClient], row: dict[str, Any], text: str
) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        assert (await _verify(connect(url), row, text))["reward"] == 1.0


COMPARISONS = [
    (row["responses_create_params"]["input"][0]["content"], row["expected_answer"])
    for row in map(json.loads, DATA.read_text().splitlines())
    if "more inhabitants" in row["responses_create_params"]["input"][0]["content"]
]


@pytest.mark.parametrize(("prompt", "expected"), COMPARISONS)
@pytest.mark.parametrize(
    "template", ["{a} or {b}", "{b} or {a}", "Either {b} or {a}.", "{a}/{b}", "{a} and {b}"]
)
async def test_a_comparison_answered_with_both_candidates_scores_0(
    connect: Callable[[str], EnvClient], prompt: str, expected: str, template: str
) -> None:
    a, b = re.findall(r", (.+) or (.+)\?$", prompt)[0]
    row = _row(prompt, expected, a, b)
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        body = await _verify(connect(url), row, template.format(a=a, b=b))
    assert (body["reward"], body["reason"]) == (0.0, "several_candidates")


@pytest.mark.parametrize(("prompt", "expected"), COMPARISONS)
async def test_no_answer_to_a_comparison_is_paid_for_both_candidates(
    connect: Callable[[str], EnvClient], prompt: str, expected: str
) -> None:
    a, b = re.findall(r", (.+) or (.+)\?$", prompt)[0]
    texts = [f"{x} has more inhabitants than {y}." for x, y in ((a, b), (b, a))] + [
        f"{a} has more than {b}, or {b} has more than {a}.",
        f"Not {b} but {a}.",
    ]
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        for text in texts:
            paid = [
                (await _verify(env, _row(prompt, choice, a, b), text))["reward"]
                for choice in (a, b)
            ]
            assert sum(paid) <= 1.0, (text, paid)


@pytest.mark.parametrize(
    ("keys", "text"),
    [
        (["Atlantis"], "48213"),  # a key that does not exist
        (["Brackenhollt"], "Brackenholt has 48,213 residents."),
        (["Velmora"], "Brackenholt has 48,213 residents."),  # an entry without the answer
    ],
)
# (A comparison looked up on one side only: test_a_comparison_needs_both_lookups.)
async def test_an_answer_the_lookups_did_not_return_scores_0(
    connect: Callable[[str], EnvClient], keys: list[str], text: str
) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        row = {k: v for k, v in POPULATION.items() if k != "lookups"}
        sid = await env.seed(row)
        for key in keys:
            await env.call("lookup", {"key": key}, sid)
        status, body = await env.verify(row, text, sid)
    assert status == 200
    assert body["reward"] == 0.0
    assert body["tool_called"] == (0 if keys[0] != "Velmora" else 1)


async def test_a_comparison_needs_both_lookups(connect: Callable[[str], EnvClient]) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        for keys, reward in (
            (["Velmora"], 0.0),
            (["Serrowby"], 0.0),
            (["Velmora", "Serrowby"], 1.0),
        ):
            body = await _verify(env, COMPARISON, "Velmora has more inhabitants.", keys)
            assert body["reward"] == reward, keys


@pytest.mark.parametrize(
    "key", ["B" * 5_000_000, "\x00\x01", "\u202eBrackenholt", "../verify", "Bracken" * 20]
)
async def test_odd_keys_are_refused_by_the_tool(
    connect: Callable[[str], EnvClient], key: str
) -> None:
    async with serve_server(LookupEnv, name="lookup") as (url, _):
        env = connect(url)
        sid = await env.seed({"responses_create_params": {"input": "?"}, "expected_answer": "1"})
        status, body = await env.call("lookup", {"key": key}, sid)
        assert status == 404, body
        assert len(body["error"]["message"]) < 1000  # the key is not echoed back whole
        assert (await env.request("GET", "/health"))[0] == 200
