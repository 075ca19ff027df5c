"""Issue 41, item 4: every record says what it cost, the run's ledger matches what the providers
billed, and ``collect.budget`` stops a run cleanly at its cap.

The stack is real and on 127.0.0.1: ``openai_proxy`` in front of a fake upstream that bills by
tokens (``tests.support.billing``: its own count is the ground truth, and it refuses some
requests with 503, unbilled, which the proxy retries), the judge environment asking a second
``openai_proxy`` in front of a billing judge upstream, rollgym's tool agent, and the collector.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import Collector
from rollgym.collect.cost import RETRIED as RETRIED_KEY
from rollgym.collect.cost import rollout_cost
from rollgym.collect.cost_ledger import cost_ledger
from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.collect.rundir import EXIT_BUDGET, RunOutcome, prepare_run
from rollgym.config import PriceTable, parse_config
from rollgym.errors import ConfigError, InternalError, RollgymError
from rollgym.http import Target
from rollgym.server.usage import call_tokens
from rollgym.server.usage import rollout_cost as agent_cost
from rollgym.testing import serve_server
from rollgym.wire import COST_FIELD
from tests.support.billing import BillingUpstream, serve_billing
from tests.support.ledger import assert_ledger_invariant
from tests.support.stack import FAST_RETRY, fast_policy

pytestmark = pytest.mark.timeout(120)

PRICES = {
    "date": "2026-12-01",
    "models": {
        "policy-model": {"input_per_1m": 0.5, "output_per_1m": 1.5},
        "judge-model": {"input_per_1m": 3.0, "output_per_1m": 15.0},
    },
}
FAST_UPSTREAM = {"max_attempts": 4, "backoff_initial": 0.01, "backoff_max": 0.02}


@dataclass
class Billing:
    urls: dict[str, list[str]]
    model: BillingUpstream
    judge: BillingUpstream


def config(collect: dict[str, Any], **more: dict[str, Any]) -> Any:
    servers = {
        "model": {"kind": "model", "impl": "openai_proxy", "retry": FAST_RETRY,
                  "options": {"base_url": "http://unused/v1"}},
        "judge": {"kind": "model", "impl": "openai_proxy", "retry": FAST_RETRY,
                  "options": {"base_url": "http://unused/v1"}},
        "env": {"kind": "resources", "impl": "judge", "retry": FAST_RETRY,
                "options": {"judge": "judge"}},
        "agent": {"kind": "agent", "impl": "tool_agent",
                  "options": {"model": "model", "resources": "env"}},
        **more,
    }  # fmt: skip
    return parse_config({"servers": servers, "collect": collect}, "test-config")


@asynccontextmanager
async def billing_stack(
    judge_fail_every: int = 5,
    model: BillingUpstream | None = None,
    judge: BillingUpstream | None = None,
    upstream_retry: dict[str, Any] | None = None,
) -> AsyncIterator[Billing]:
    model_up = BillingUpstream(fail_every=7) if model is None else model
    judge_up = BillingUpstream(judge=True, fail_every=judge_fail_every) if judge is None else judge
    retry = FAST_UPSTREAM if upstream_retry is None else upstream_retry
    async with serve_billing(model_up) as model_base, serve_billing(judge_up) as judge_base:

        def proxy(base: str, model: str) -> dict[str, Any]:
            return {"base_url": base + "/v1", "model": model, "upstream_retry": retry,
                    "idle_timeout": None}  # fmt: skip

        async with (
            serve_server("openai_proxy", name="model", options=proxy(model_base, "policy-model"))
            as (model_url, _),
            serve_server("openai_proxy", name="judge", options=proxy(judge_base, "judge-model"))
            as (judge_url, _),
        ):  # fmt: skip
            judge = Target.single("judge", judge_url, fast_policy("model"))
            async with serve_server(
                "judge", name="env", options={"judge": "judge"}, peers={"judge": judge}
            ) as (env_url, _):
                peers = {
                    "model": Target.single("model", model_url, fast_policy("model")),
                    "env": Target.single("env", env_url, fast_policy("resources")),
                }
                async with serve_server(
                    "tool_agent", name="agent", peers=peers,
                    options={"model": "model", "resources": "env"},
                ) as (agent_url, _):  # fmt: skip
                    urls = {"model": [model_url], "judge": [judge_url], "env": [env_url],
                            "agent": [agent_url]}  # fmt: skip
                    yield Billing(urls, model_up, judge_up)


def write_rows(path: Path, n: int) -> Path:
    rows = [
        {"responses_create_params": {"input": f"question {i}: how many words are in this line"},
         "expected_answer": str(i)}
        for i in range(n)
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


async def collect(
    stack: Billing, tmp_path: Path, n: int, collect: dict[str, Any], *, resume: bool = False
) -> RunOutcome:
    cfg = config({"concurrency": 4, "rollout_timeout": 60, **collect})
    tasks = write_rows(tmp_path / "tasks.jsonl", n)
    run = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=resume)
    async with asyncio.timeout(90):
        return await Collector(run, stack.urls, progress=False).execute()


def lines(out: Path, name: str = "rollouts.jsonl") -> list[dict[str, Any]]:
    path = out / name
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def near(got: float, truth: float) -> bool:
    """Within 1% of the ground truth."""
    return abs(got - truth) <= 0.01 * truth


async def test_the_ledger_matches_what_the_providers_billed(tmp_path: Path) -> None:
    async with billing_stack() as stack:
        outcome = await collect(stack, tmp_path, 24, {"repeats": 2, "prices": PRICES})
    assert outcome.exit_code == 0, outcome.abort_reason
    out = tmp_path / "out"
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert orjson.loads((out / "metrics.json").read_bytes())["cost"] == cost
    # Kept as the lines were written, it is what the lines say.
    assert cost == cost_ledger(out, 2, PriceTable.model_validate(PRICES))
    totals = cost["totals"]
    model, judge = stack.model.billed, stack.judge.billed
    assert model.calls > 0 and judge.calls > 0
    # The upstreams refused some requests (503, unbilled) and the proxies tried them again.
    assert stack.model.requests > model.calls and stack.judge.requests > judge.calls
    assert totals["model_calls"] == model.calls
    assert near(totals["input_tokens"], model.input_tokens)
    assert near(totals["output_tokens"], model.output_tokens)
    assert totals["judge_calls"] == judge.calls
    assert near(totals["judge_input_tokens"], judge.input_tokens)
    assert near(totals["judge_output_tokens"], judge.output_tokens)
    truth = (
        model.input_tokens * 0.5 + model.output_tokens * 1.5
        + judge.input_tokens * 3.0 + judge.output_tokens * 15.0
    ) / 1e6  # fmt: skip
    assert near(cost["money"], truth)
    assert cost["prices"] == {"date": "2026-12-01", "currency": "USD"}
    assert totals["unpriced_tokens"] == 0

    # Every rollout is useful or wasted, for one cause: here odd questions are judged wrong
    # and even ones right, each for both repeats: every group has one reward, no signal.
    assert cost["rollouts"] == 48
    assert cost["wasted"]["no_signal"]["rollouts"] == 48
    assert cost["useful"]["rollouts"] == 0
    assert cost["per_useful_sample"]["tokens"] is None

    # Each line carries its own cost: model calls' tokens, times, the judge's calls.
    for line in lines(out):
        got = line[COST_FIELD]
        assert got["calls"] == 1 and got["judge_calls"] == 1 and got["model"] == "policy-model"
        assert got["judge_model"] == "judge-model"
        assert got["input_tokens"] > 0 and got["model_s"] > 0 and got["verify_s"] > 0
        assert got["per_call"] == [[got["input_tokens"], got["output_tokens"]]]


async def test_a_budget_stops_the_run_within_one_rollout_of_its_cap(tmp_path: Path) -> None:
    async with billing_stack() as stack:
        cap = 600
        budget = {"tokens": cap, "in_flight": "abandon"}
        outcome = await collect(stack, tmp_path, 40, {"budget": budget})
        out = tmp_path / "out"
        recorded = lines(out)
        spent = [line[COST_FIELD] for line in recorded]
        tokens = [c["input_tokens"] + c["output_tokens"] + c["judge_input_tokens"]
                  + c["judge_output_tokens"] for c in spent]  # fmt: skip
        assert outcome.status == "stopped_at_budget" and outcome.exit_code == EXIT_BUDGET
        assert "collect.budget.tokens" in (outcome.abort_reason or "")
        # At the cap, and past it by less than the one rollout that reached it.
        assert sum(tokens) >= cap
        assert sum(tokens) - max(tokens) < cap
        assert 0 < len(recorded) < 40
        info = orjson.loads((out / "run.json").read_bytes())
        assert info["status"] == "stopped_at_budget" and info["exit_code"] == EXIT_BUDGET
        assert info["budget"]["in_flight"] == "abandon"
        assert info["budget"]["tokens"] == sum(tokens)
        cost = orjson.loads((out / "cost.json").read_bytes())
        assert cost["abandoned_in_flight"] == info["budget"]["abandoned"]

        # Nothing recorded is lost: --resume with a larger budget finishes the run, and counts
        # what the first session spent.
        again = await collect(stack, tmp_path, 40, {"budget": {"tokens": 10**9}}, resume=True)
    assert again.exit_code == 0, again.abort_reason
    rollouts, failures = assert_ledger_invariant(out)
    assert len(rollouts) + len(failures) == 40
    assert recorded == lines(out)[: len(recorded)]


async def test_abandoned_rollouts_are_those_started_and_not_recorded(tmp_path: Path) -> None:
    """At an ``abandon`` cap, ``abandoned`` counts the rollouts that had started (sent to their
    agent: here held at the model) and are not recorded; the ones never started are
    ``not_started``; both are pending, for ``--resume``. The model's own count of the
    rollouts that reached it is the ground truth."""
    from tests.support.stack import run_held_to_an_abandon_cap, running_stack

    async with running_stack(model_options={"hold_each": True}) as stack:
        outcome = await run_held_to_an_abandon_cap(stack, tmp_path, 8, 4)
        reached = len(stack.model.holding)
    assert outcome.status == "stopped_at_budget" and outcome.exit_code == EXIT_BUDGET
    out = tmp_path / "out"
    assert len(lines(out)) == 1 and lines(out, "failures.jsonl") == []
    budget = orjson.loads((out / "run.json").read_bytes())["budget"]
    assert budget["abandoned"] == reached - 1 == 3, (budget, reached)
    assert budget["not_started"] == 8 - 1 - 3
    assert outcome.metrics["cost"]["abandoned_in_flight"] == 3
    assert outcome.metrics["counts"]["pending"] == budget["abandoned"] + budget["not_started"]


async def test_in_flight_rollouts_finish_at_the_cap_by_default(tmp_path: Path) -> None:
    async with billing_stack() as stack:
        outcome = await collect(stack, tmp_path, 40, {"budget": {"tokens": 400}})
        billed = stack.model.billed.calls
    assert outcome.exit_code == EXIT_BUDGET
    out = tmp_path / "out"
    recorded = lines(out)
    # Every rollout sent was recorded: every billed call is on a line.
    assert sum(line[COST_FIELD]["calls"] for line in recorded) == billed
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost["abandoned_in_flight"] == 0
    # What finished after the cap is spent too: run.json's figure is every recorded line's.
    spent = sum(c["input_tokens"] + c["output_tokens"] + c["judge_input_tokens"]
                + c["judge_output_tokens"] for c in (line[COST_FIELD] for line in recorded))  # fmt: skip
    info = orjson.loads((out / "run.json").read_bytes())
    assert info["budget"]["tokens"] == spent


def test_a_money_budget_needs_a_price_table() -> None:
    with pytest.raises(ConfigError) as caught:
        config({"budget": {"money": 5}})
    assert "collect: budget.money needs a price table" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        config({"prices": {"models": {}}})
    assert "collect.prices.date" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        config({"budget": {"in_flight": "wait"}})
    assert "collect.budget.in_flight" in str(caught.value)


def test_tokens_are_counted_from_token_ids_when_usage_is_absent() -> None:
    answer = {"output": [{"type": "message", "prompt_token_ids": [1, 2, 3],
                          "generation_token_ids": [4, 5]}]}  # fmt: skip
    assert call_tokens(answer) == (3, 2)
    assert call_tokens({"usage": {"input_tokens": 7, "output_tokens": 1}, **answer}) == (7, 1)
    assert call_tokens({"output": []}) is None


def test_a_record_without_metering_says_so_and_a_failure_is_never_free() -> None:
    prices = PriceTable.model_validate(PRICES)
    verified = {"reward": 1.0, "response": {"model": "unknown-model", "output": []}}
    # One call whose answer said no tokens: counted as a call, not as free tokens.
    measured = agent_cost(verified, {"model": [0.25, 0.25]}, [None, [10, 2]], {"model": 1})
    assert measured == {"calls": 2, "input_tokens": 10, "output_tokens": 2,
                        "per_call": [None, [10, 2]], "unmetered_calls": 1, "model": "unknown-model", "model_s": 0.5,
                        "retries": 1}  # fmt: skip
    record = ScoredRollout(0, 0, 1.0, 1, 0.6, {**verified, COST_FIELD: measured})
    cost = rollout_cost(record, prices)
    assert cost["unpriced_tokens"] == 12 and cost["money"] == 0.0
    failed = FailedRollout(0, 1, InternalError("boom"), 2, 1.5)
    assert rollout_cost(failed, prices) == {"metered": False}
    # An agent that is not rollgym's: the response's summed usage stands in.
    foreign = {
        "reward": 1.0,
        "response": {"model": "policy-model", "usage": {"input_tokens": 40, "output_tokens": 8}},
    }
    cost = rollout_cost(ScoredRollout(0, 2, 1.0, 1, 0.6, foreign), prices)
    assert (cost["calls"], cost["input_tokens"], cost["output_tokens"]) == (1, 40, 8)
    assert cost["money"] == round((40 * 0.5 + 8 * 1.5) / 1e6, 8)
    # ... and so it does for a cost no rollgym agent wrote (a foreign agent echoing a row's):
    # never a crash of the collector, never its numbers.
    from rollgym.collect.spend import RunSpend

    junk = ScoredRollout(1, 0, 1.0, 1, 0.6, {**foreign, COST_FIELD: {"input_tokens": "lots"}})
    spend = RunSpend(None, None)
    extra = spend.stamp(junk)
    assert extra is not None and extra[COST_FIELD]["input_tokens"] == 40
    assert spend.ledger.to_dict(None)["totals"]["input_tokens"] == 40


async def test_the_trainer_api_says_the_cost_per_useful_sample() -> None:
    from rollgym.trainer import BatchCost, RolloutClient

    rows = [
        {"responses_create_params": {"input": f"question {i}: how many words"},
         "expected_answer": str(i)}
        for i in range(6)
    ]  # fmt: skip
    async with billing_stack() as stack, RolloutClient(stack.urls["agent"][0]) as client:
        groups = await client.collect(rows, repeats=2)
        billed = stack.model.billed.tokens + stack.judge.billed.tokens
    prices = PriceTable.model_validate(PRICES)
    cost = BatchCost.of(groups, prices)
    assert cost.rollouts == 12 and near(cost.tokens, billed)
    # Each question's two repeats get the same verdict: no group has a learning signal.
    assert cost.useful == 0 and cost.per_useful_sample == {"tokens": None, "money": None}
    assert cost.per_rollout["tokens"] == cost.tokens / 12
    assert cost.money is not None and cost.per_rollout["money"] == cost.money / 12


async def test_every_wasted_rollout_is_attributed_to_its_cause(tmp_path: Path) -> None:
    """Failed rollouts, and on --resume their earlier attempts (retried), beside the groups
    with and without a learning signal; the ledger kept as the run writes equals the one read
    back from its files."""
    from tests.support.servers import FAIL_MARKER
    from tests.support.stack import SOME_RIGHT, running_stack, stack_config, write_tasks

    tasks = write_tasks(tmp_path / "tasks.jsonl", 6, fail={1}, say=SOME_RIGHT)
    out = tmp_path / "out"
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        for resume in (False, True):
            cfg = stack_config({"concurrency": 4, "repeats": 3})
            run = prepare_run(cfg, cfg.collect, tasks, out, resume=resume)
            async with asyncio.timeout(60):
                await Collector(run, stack.urls, progress=False).execute()
            cost = orjson.loads((out / "cost.json").read_bytes())
            assert cost == cost_ledger(out, 3, None)
    wasted = cost["wasted"]
    # Their model calls failed (500, no usage said): what they billed is not known, so they
    # are counted unmetered, never as free.
    assert wasted["failed"]["rollouts"] == 3 and wasted["failed"]["unmetered"] == 3
    assert wasted["failed"]["tokens"] == 0
    assert wasted["retried"]["rollouts"] == 3  # the first session's failures, run again
    scored = lines(out)
    flat = {t for t in range(6) if t != 1
            and len({x["reward"] for x in scored if x["task_index"] == t}) == 1}  # fmt: skip
    assert wasted["no_signal"]["rollouts"] == 3 * len(flat)
    assert cost["useful"]["rollouts"] == 15 - 3 * len(flat)
    assert cost["rollouts"] == 15 + 3 + 3
    assert cost["useful"]["tokens"] + wasted["no_signal"]["tokens"] == cost["totals"]["tokens"]


async def test_a_failed_rollouts_billed_tokens_are_counted_under_its_failure(
    tmp_path: Path,
) -> None:
    """The policy model answers (and bills), then the judge is down (every request 503): each
    rollout fails at its verify. Its agent's error answer carries what it had spent, so each
    failure's line says it, and the ledger counts the billed tokens and money under ``failed``,
    metered, where it said "unmetered" before."""
    async with billing_stack(judge_fail_every=1) as stack:
        outcome = await collect(stack, tmp_path, 6, {"prices": PRICES})
        billed = stack.model.billed
    out = tmp_path / "out"
    failures = lines(out, "failures.jsonl")
    assert len(failures) == 6 and lines(out) == [], outcome.abort_reason
    assert billed.calls == 6 and stack.judge.billed.calls == 0
    for line in failures:
        got = line[COST_FIELD]
        assert got["calls"] == 1 and got["input_tokens"] > 0 and got["model_s"] > 0
        assert got["money"] > 0 and "metered" not in got
        # Said once, on the line: not a second time inside the error's body.
        assert COST_FIELD not in orjson.dumps(line["error"]).decode()
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost == cost_ledger(out, 1, PriceTable.model_validate(PRICES))
    failed = cost["wasted"]["failed"]
    assert failed["rollouts"] == 6 and failed["unmetered"] == 0
    assert failed["tokens"] == billed.tokens == cost["totals"]["tokens"]
    assert cost["totals"]["model_calls"] == billed.calls
    assert near(failed["money"], (billed.input_tokens * 0.5 + billed.output_tokens * 1.5) / 1e6)


def test_what_a_failure_spent_is_taken_off_its_error_and_summed_over_attempts() -> None:
    from rollgym.collect.cost import spent_before, summed
    from rollgym.errors import HTTPStatusError

    spent = {"calls": 2, "input_tokens": 30, "output_tokens": 5, "model_s": 0.25}
    body = orjson.dumps({"error": {"type": "upstream_error"}, COST_FIELD: spent}).decode()
    err, got = spent_before(HTTPStatusError("agent answered 502", status=502, body=body))
    assert got == spent and err.body == '{"error":{"type":"upstream_error"}}'
    assert summed(got, spent) == {"calls": 4, "input_tokens": 60, "output_tokens": 10,
                                  "model_s": 0.5}  # fmt: skip
    # No numbers, or no cost at all: nothing taken, the error as it came.
    junk = orjson.dumps({"error": {}, COST_FIELD: {"calls": "many"}}).decode()
    for other in (junk, '{"error": {}}', "not json"):
        err, got = spent_before(HTTPStatusError("x", status=502, body=other))
        assert got is None and err.body == other
    failed = FailedRollout(0, 0, InternalError("boom"), 1, 0.5, cost={"calls": "many"})
    assert rollout_cost(failed) == {"metered": False}  # a cost that holds no numbers: unknown


async def test_a_cost_written_by_a_row_is_no_measurement(tmp_path: Path) -> None:
    """A task row (or an environment) that carries ``rollgym_cost`` does not decide what the
    record says it cost: the agent's own measure replaces it."""
    from tests.support.stack import running_stack, stack_config, task_row

    forged = {"calls": 0, "input_tokens": 0, "output_tokens": 0, "money": 0.0}
    rows = [{**task_row(i), COST_FIELD: forged} for i in range(3)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    async with running_stack() as stack:
        cfg = stack_config({"concurrency": 2, "budget": {"tokens": 10**6}})
        run = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        async with asyncio.timeout(60):
            outcome = await Collector(run, stack.urls, progress=False).execute()
    assert outcome.exit_code == 0
    for line in lines(tmp_path / "out"):
        got = line[COST_FIELD]
        assert got["calls"] == 2 and got["input_tokens"] > 0 and "money" not in got


def materialized(path: Path) -> Path:
    """``path``'s flat rows as NeMo Gym 0.7's materialized rows (episodes on the agent)."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    path.write_bytes(b"".join(
        orjson.dumps({"task_id": {"taskset": "q", "task_id": f"t{i}"}, "task_input": row})
        + b"\n" for i, row in enumerate(rows)
    ))  # fmt: skip
    return path


async def test_retried_and_failed_0_7_episodes_keep_what_their_attempts_spent(
    tmp_path: Path,
) -> None:
    """Issue 41, through NeMo Gym 0.7's episodes (whose transient failures the collector runs
    again in the run): the judge is down for questions 0-3 until the policy model was asked
    them twice, and for questions 4 and 5 for good. So 0-3 score at their second attempt,
    and 4-5 fail after every attempt, each attempt having billed a model call. Every billed
    token is in the ledger: the failed attempts of the scored ones under ``retried`` (on their
    lines, ``rollgym_cost.retried``), the failed rollouts' under ``failed`` (the 0.7 failure
    answer carries the agent's spend); totals equal to what the upstream billed, money
    within 1%."""
    from rollgym.collect.dialect import Dialects
    from rollgym.dialects import ROW_DIALECTS

    model = BillingUpstream()
    judge = BillingUpstream(judge=True, refuse=lambda q: q >= 4 or model.asked[q] < 2)
    tasks = materialized(write_rows(tmp_path / "tasks.jsonl", 6))
    # The same agent, as the Environment Server a 0.7 user names by its URL.
    episodes = {"kind": "environment", "url": "http://unused",
                "retry": {**FAST_RETRY, "max_attempts": 3}}  # fmt: skip
    cfg = config({"concurrency": 3, "rollout_timeout": 60, "prices": PRICES,
                  "max_rollout_attempts": 3, "max_failure_rate": None,
                  "taskset_routes": {"q": "episodes"}}, episodes=episodes)  # fmt: skip
    out = tmp_path / "out"
    async with billing_stack(model=model, judge=judge) as stack:
        urls = {**stack.urls, "episodes": stack.urls["agent"]}
        run = prepare_run(cfg, cfg.collect, tasks, out, resume=False,
                          dialects=Dialects(ROW_DIALECTS))  # fmt: skip
        async with asyncio.timeout(90):
            await Collector(run, urls, progress=False).execute()
    billed = model.billed
    scored, failures = lines(out), lines(out, "failures.jsonl")
    assert sorted(x["task_index"] for x in scored) == [0, 1, 2, 3]
    assert sorted(x["task_index"] for x in failures) == [4, 5]
    assert [model.asked[q] for q in range(6)] == [2, 2, 2, 2, 3, 3]
    first: dict[int, int] = {}  # each question's tokens, as one attempt spent them
    for line in scored:
        got = line[COST_FIELD]
        assert line["attempts"] == 2 and got["calls"] == 2, got
        retried = got["retried"]
        assert retried["calls"] == 1 and retried["attempts"] == 1 and retried["money"] > 0
        # The same question twice: the failed attempt spent what the scored one did.
        assert got["per_call"] == [[retried["input_tokens"], retried["output_tokens"]]]
        first[line["task_index"]] = retried["input_tokens"] + retried["output_tokens"]
    for line in failures:
        got = line[COST_FIELD]
        assert line["attempts"] == 3 and got["calls"] == 3 and "metered" not in got, got
        assert "retried" not in got and got["money"] > 0
        assert COST_FIELD not in orjson.dumps(line["error"]).decode()  # said once
        first[line["task_index"]] = (got["input_tokens"] + got["output_tokens"]) // 3
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost == cost_ledger(out, 1, PriceTable.model_validate(PRICES))  # as written
    totals = cost["totals"]
    assert totals["model_calls"] == billed.calls == 14
    assert totals["input_tokens"] == billed.input_tokens
    assert totals["output_tokens"] == billed.output_tokens
    judged = stack.judge.billed
    truth = (billed.input_tokens * 0.5 + billed.output_tokens * 1.5
             + judged.input_tokens * 3.0 + judged.output_tokens * 15.0) / 1e6  # fmt: skip
    assert near(cost["money"], truth)
    wasted = cost["wasted"]
    retried = wasted["retried"]
    assert retried["rollouts"] == 0 and retried["attempts"] == 4  # counted where they ended
    assert retried["tokens"] == sum(first[q] for q in range(4)) and retried["unmetered"] == 0
    failed = wasted["failed"]
    assert failed["rollouts"] == 2 and failed["attempts"] == 6 and failed["unmetered"] == 0
    assert failed["tokens"] == 3 * (first[4] + first[5])
    model_money = (billed.input_tokens * 0.5 + billed.output_tokens * 1.5) / 1e6
    share = (retried["tokens"] + failed["tokens"]) / billed.tokens
    assert near(retried["money"] + failed["money"], model_money * share)
    kept = cost["useful"]["tokens"] + wasted["no_signal"]["tokens"]
    assert kept + retried["tokens"] + failed["tokens"] == totals["tokens"]


async def test_a_failed_model_call_counts_what_its_error_says_it_billed(tmp_path: Path) -> None:
    """Issue 41: the model upstream bills each question's first call and then answers 500
    with the ``usage`` it billed in its error body; for questions 4 and 5 it does so every
    time. The proxy tries the upstream again (``upstream_retry``: 4 attempts): 0-3 are answered
    at the second, 4-5 fail after the fourth. Every failed attempt is counted as a call with
    its billed tokens (the proxy says them on its answer, or on its error), so the ledger's
    totals are what the upstream billed, and its money within 1%."""
    model = BillingUpstream(fail_billed=lambda q: q >= 4 or model.asked[q] == 1)
    async with billing_stack(judge_fail_every=0, model=model) as stack:
        await collect(stack, tmp_path, 6, {"prices": PRICES, "max_failure_rate": None})
    out = tmp_path / "out"
    scored, failures = lines(out), lines(out, "failures.jsonl")
    assert sorted(x["task_index"] for x in scored) == [0, 1, 2, 3]
    assert sorted(x["task_index"] for x in failures) == [4, 5]
    billed = model.billed
    assert billed.calls == 4 * 2 + 2 * 4
    for line in scored:
        got = line[COST_FIELD]
        assert got["calls"] == 2 and got["failed_calls"] == 1, got
        assert "unmetered_calls" not in got and None not in got["per_call"]
    for line in failures:
        got = line[COST_FIELD]
        assert got["failed_calls"] == got["calls"] == 4 and got["input_tokens"] > 0, got
        assert got["model"] == "policy-model" and got["money"] > 0
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost == cost_ledger(out, 1, PriceTable.model_validate(PRICES))
    totals = cost["totals"]
    assert totals["model_calls"] == billed.calls
    assert totals["input_tokens"] == billed.input_tokens
    assert totals["output_tokens"] == billed.output_tokens
    assert totals["unpriced_tokens"] == 0
    judged = stack.judge.billed
    truth = (billed.input_tokens * 0.5 + billed.output_tokens * 1.5
             + judged.input_tokens * 3.0 + judged.output_tokens * 15.0) / 1e6  # fmt: skip
    assert near(cost["money"], truth)
    assert cost["wasted"]["failed"]["unmetered"] == 0


async def test_a_failed_model_call_whose_error_says_nothing_is_unmetered(tmp_path: Path) -> None:
    """The same billed 500s with no ``usage`` in the error: their tokens are not known, and
    the records and the ledger say so (``unmetered``), never counting them as 0 silently."""
    model = BillingUpstream(fail_billed=lambda q: model.asked[q] == 1, usage_on_error=False)
    async with billing_stack(judge_fail_every=0, model=model) as stack:
        await collect(stack, tmp_path, 4, {"prices": PRICES})
    out = tmp_path / "out"
    scored = lines(out)
    assert len(scored) == 4
    for line in scored:
        got = line[COST_FIELD]
        assert got["calls"] == 2 and got["unmetered_calls"] == 1 and got["per_call"][0] is None
    cost = orjson.loads((out / "cost.json").read_bytes())
    counted = cost["useful"]["unmetered"] + cost["wasted"]["no_signal"]["unmetered"]
    assert counted == 4
    # What was counted is what the answered calls billed: half the billed tokens here.
    assert cost["totals"]["tokens"] - stack.judge.billed.tokens == model.billed.tokens // 2


async def test_a_failed_judge_call_counts_what_its_error_says_it_billed(tmp_path: Path) -> None:
    """Issue 41, judge calls: the judge upstream bills each question's first call and then
    answers 500 with the ``usage`` it billed; for questions 4 and 5 it does so every time. The
    judge's proxy tries it again (4 attempts): 0-3 are judged at the second, and the verify of
    4-5 fails after the fourth, so those rollouts fail. Every billed judge call is counted,
    the failed ones as ``judge_failed_calls`` with their tokens, on the scored lines and on the
    failures (the environment's error answer carries its spend, the agent's carries it on):
    the ledger's judge totals are what the judge upstream billed, its money within 1%."""
    judge = BillingUpstream(judge=True, fail_billed=lambda q: q >= 4 or judge.asked[q] == 1)
    async with billing_stack(judge_fail_every=0, judge=judge) as stack:
        await collect(stack, tmp_path, 6, {"prices": PRICES, "max_failure_rate": None})
    out = tmp_path / "out"
    scored, failures = lines(out), lines(out, "failures.jsonl")
    assert sorted(x["task_index"] for x in scored) == [0, 1, 2, 3]
    assert sorted(x["task_index"] for x in failures) == [4, 5]
    judged = judge.billed
    assert judged.calls == 4 * 2 + 2 * 4 and judge.failed_billed.calls == 4 + 2 * 4
    for line in scored:
        got = line[COST_FIELD]
        assert got["judge_calls"] == 2 and got["judge_failed_calls"] == 1, got
        assert "judge_unmetered_calls" not in got and got["judge_model"] == "judge-model"
    for line in failures:
        got = line[COST_FIELD]
        assert got["judge_calls"] == got["judge_failed_calls"] == 4, got
        assert got["judge_input_tokens"] > 0 and got["judge_model"] == "judge-model"
        assert got["calls"] == 1 and got["money"] > 0 and "metered" not in got
        assert RollgymError.from_dict(line["error"]).root().server == "judge.upstream"
        assert COST_FIELD not in orjson.dumps(line["error"]).decode()  # said once
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost == cost_ledger(out, 1, PriceTable.model_validate(PRICES))
    totals = cost["totals"]
    assert totals["judge_calls"] == judged.calls
    assert totals["failed_judge_calls"] == judge.failed_billed.calls
    assert totals["judge_input_tokens"] == judged.input_tokens
    assert totals["judge_output_tokens"] == judged.output_tokens
    assert totals["unmetered_judge_calls"] == 0 and totals["unpriced_tokens"] == 0
    billed = stack.model.billed
    truth = (billed.input_tokens * 0.5 + billed.output_tokens * 1.5
             + judged.input_tokens * 3.0 + judged.output_tokens * 15.0) / 1e6  # fmt: skip
    assert near(cost["money"], truth)
    failed = cost["wasted"]["failed"]
    assert failed["rollouts"] == 2 and failed["unmetered"] == 0
    line_tokens = sum(
        c["input_tokens"] + c["output_tokens"] + c["judge_input_tokens"] + c["judge_output_tokens"]
        for c in (line[COST_FIELD] for line in failures)
    )
    assert failed["tokens"] == line_tokens


async def test_a_failed_judge_call_whose_error_says_nothing_is_unmetered(tmp_path: Path) -> None:
    """The same billed 500s from the judge with no ``usage`` in the error (question 3's every
    time, so its verify fails): each is counted as a judge call whose tokens are not known
    (``judge_unmetered_calls``), never as 0 tokens silently, and the ledger counts those
    rollouts as ``unmetered``; the judge tokens it counts are those of the answered calls."""
    judge = BillingUpstream(
        judge=True, fail_billed=lambda q: q >= 3 or judge.asked[q] == 1, usage_on_error=False
    )
    async with billing_stack(judge_fail_every=0, judge=judge) as stack:
        await collect(stack, tmp_path, 4, {"prices": PRICES, "max_failure_rate": None})
    out = tmp_path / "out"
    scored, failures = lines(out), lines(out, "failures.jsonl")
    assert len(scored) == 3 and [x["task_index"] for x in failures] == [3]
    for line in scored:
        got = line[COST_FIELD]
        assert got["judge_calls"] == 2 and got["judge_unmetered_calls"] == 1, got
        assert got["judge_failed_calls"] == 1 and got["judge_input_tokens"] > 0
    (failure,) = failures
    got = failure[COST_FIELD]
    assert got["judge_calls"] == got["judge_unmetered_calls"] == got["judge_failed_calls"] == 4
    assert got["judge_input_tokens"] == 0 and got["calls"] == 1 and "metered" not in got
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost == cost_ledger(out, 1, PriceTable.model_validate(PRICES))
    totals, failed_billed = cost["totals"], judge.failed_billed
    assert totals["judge_calls"] == judge.billed.calls == 3 * 2 + 4
    assert totals["unmetered_judge_calls"] == totals["failed_judge_calls"] == failed_billed.calls
    answered = judge.billed.tokens - failed_billed.tokens
    assert totals["judge_input_tokens"] + totals["judge_output_tokens"] == answered
    assert cost["wasted"]["failed"]["unmetered"] == 1
    assert cost["useful"]["unmetered"] + cost["wasted"]["no_signal"]["unmetered"] == 3


async def test_the_trainer_api_counts_failed_judge_calls() -> None:
    """``BatchCost`` counts a judge's failed calls (and says the batch's rollouts with judge
    calls of unknown tokens unmetered), as the run's ledger does."""
    from rollgym.trainer import BatchCost, RolloutClient

    rows = [
        {"responses_create_params": {"input": f"question {i}: how many words"},
         "expected_answer": str(i)}
        for i in range(3)
    ]  # fmt: skip
    judge = BillingUpstream(judge=True, fail_billed=lambda q: judge.asked[q] % 2 == 1)
    async with (
        billing_stack(judge_fail_every=0, judge=judge) as stack,
        RolloutClient(stack.urls["agent"][0]) as client,
    ):
        groups = await client.collect(rows, repeats=2)
    cost = BatchCost.of(groups, PriceTable.model_validate(PRICES))
    assert cost.rollouts == 6 and cost.unmetered == 0
    assert cost.judge_calls == judge.billed.calls == 12
    assert cost.judge_failed_calls == judge.failed_billed.calls == 6
    assert cost.tokens == stack.model.billed.tokens + judge.billed.tokens


def test_a_failed_verify_attempts_spend_is_read_once_and_added_to_a_retried_verify() -> None:
    """What a failed verify attempt's answer says it spent (``rollgym_cost`` beside its error)
    is read off it (and taken off the error the record keeps), and added to the judge counts
    of the verify that answered after it; an answer that says nothing adds nothing."""
    from rollgym.errors import HTTPStatusError
    from rollgym.server.usage import verify_spend, with_verify_spend, without_spend

    said = {"judge_calls": 2, "judge_failed_calls": 2, "judge_input_tokens": 40,
            "judge_output_tokens": 0, "judge_unmetered_calls": 1, "judge_model": "judge-model",
            "calls": 99}  # fmt: skip
    body = orjson.dumps({"error": {"type": "upstream_error"}, COST_FIELD: said}).decode()
    failed = HTTPStatusError("env answered 502", status=502, body=body)
    spent: dict[str, Any] = {}
    for err in (failed, HTTPStatusError("x", status=502, body='{"error": {}}')):
        verify_spend(err, spent)
    assert spent == {k: v for k, v in said.items() if k != "calls"}  # judge counts only
    assert without_spend(failed).body == '{"error":{"type":"upstream_error"}}'
    verified = {"reward": 1.0, "judge_calls": 1, "judge_input_tokens": 10,
                "judge_output_tokens": 3}  # fmt: skip
    cost = agent_cost(with_verify_spend(verified, spent), {}, [[5, 1]], {})
    assert cost["judge_calls"] == 3 and cost["judge_failed_calls"] == 2
    assert (cost["judge_input_tokens"], cost["judge_output_tokens"]) == (50, 3)
    assert cost["judge_unmetered_calls"] == 1 and cost["judge_model"] == "judge-model"
    # An environment that says its judge calls and not their tokens: all of them unmetered.
    assert agent_cost({"judge_calls": 2}, {}, [], {})["judge_unmetered_calls"] == 2


FORGED = [
    {"calls": 1, "input_tokens": -(10**6), "output_tokens": 5},  # would hide spend from a budget
    {"calls": 1, "judge_calls": 1, "judge_input_tokens": 2**64 - 1},  # two: past 64 bits
    {"calls": 1, "input_tokens": 1e300},
    {"calls": 1, "input_tokens": 5, RETRIED_KEY: {"calls": "many"}},  # nested junk
    {"calls": 1, "input_tokens": 5, RETRIED_KEY: {"input_tokens": -5}},
]


async def test_a_forged_cost_from_a_foreign_agent_is_no_measurement(tmp_path: Path) -> None:
    """A foreign agent (or the environment whose verify answer it passes on, as NeMo Gym's
    does) whose ``rollgym_cost`` holds negative, huge or nested junk counts, on its answers and
    on its error bodies: the collector neither crashes nor counts them. The scored rollout is
    counted from its response's ``usage``, the failed one as unmetered, and ``cost.json`` (and
    a ledger read back from the files) says the truth: 5 rollouts of 10 tokens."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from rollgym.testing import serve_asgi
    from tests.support.stack import running_stack, stack_config, task_row

    async def run(request: Request) -> JSONResponse:
        row = orjson.loads(await request.body())
        i = row["_i"]
        forged = FORGED[i % len(FORGED)]
        if i >= len(FORGED):  # a failure whose error body carries the junk
            body = {"error": {"type": "internal_error", "message": "no"}, COST_FIELD: forged}
            return JSONResponse(body, status_code=500)
        response = {"model": "m", "output": [], "usage": {"input_tokens": 7, "output_tokens": 3}}
        return JSONResponse({"reward": 1.0, "response": response, COST_FIELD: forged})

    app = Starlette(routes=[Route("/run", run, methods=["POST"])])
    rows = [{**task_row(i), "_i": i} for i in range(2 * len(FORGED))]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    async with running_stack() as stack, serve_asgi(app) as forger:
        cfg = stack_config({"concurrency": 2, "max_failure_rate": None,
                            "budget": {"tokens": 10**6}})  # fmt: skip
        run_ = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        async with asyncio.timeout(60):
            outcome = await Collector(run_, {**stack.urls, "agent": [forger]},
                                      progress=False).execute()  # fmt: skip
    out = tmp_path / "out"
    assert outcome.metrics["counts"]["succeeded"] == len(FORGED), outcome.abort_reason
    for line in lines(out):
        assert line[COST_FIELD]["input_tokens"] == 7 and line[COST_FIELD]["output_tokens"] == 3
    for line in lines(out, "failures.jsonl"):
        assert line[COST_FIELD] == {"metered": False}
    cost = orjson.loads((out / "cost.json").read_bytes())
    assert cost["totals"]["tokens"] == 10 * len(FORGED)
    assert cost["wasted"]["failed"]["unmetered"] == len(FORGED)
    assert cost == cost_ledger(out, 1, None)
    info = orjson.loads((out / "run.json").read_bytes())
    assert info["status"] == "completed_with_failures" and "budget" not in info


async def test_an_environments_impossible_counts_leave_the_agents_measure_whole(
    tmp_path: Path,
) -> None:
    """An environment whose verify answer says 2**64 - 1 judge tokens and 1e308 sandbox
    seconds: the agent does not take those counts (its judge calls are unmetered, said so,
    and no sandbox time), so the line keeps the agent's own measure of its model calls
    rather than losing it to the collector's usage fallback."""
    from tests.support.servers import CountingEcho
    from tests.support.stack import running_stack, stack_config, write_tasks

    class Boasting(CountingEcho):
        async def verify(self, session: Any, task: dict[str, Any], response: Any) -> Any:
            reward = await super().verify(session, task, response)
            return {"reward": reward, "judge_calls": 1, "judge_input_tokens": 2**64 - 1,
                    "judge_output_tokens": 1, "sandbox_s": 1e308}  # fmt: skip

    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    async with running_stack(env=Boasting) as stack:
        cfg = stack_config({"concurrency": 2})
        run = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        async with asyncio.timeout(60):
            outcome = await Collector(run, stack.urls, progress=False).execute()
    assert outcome.exit_code == 0, outcome.abort_reason
    for line in lines(tmp_path / "out"):
        got = line[COST_FIELD]
        assert got["calls"] == 2 and len(got["per_call"]) == 2, got
        assert got["judge_calls"] == got["judge_unmetered_calls"] == 1, got
        assert "judge_input_tokens" not in got and "sandbox_s" not in got, got


def test_the_ledger_says_the_same_whatever_order_its_records_came_in() -> None:
    """The ledger kept as records arrive and the one read back from the files add the same
    numbers in other orders (failures interleaved, or after the rollouts): a sum that falls on
    a rounding boundary (0.5385 + 0.6235 + 0.6125 = 1.7745 s) must round the same both ways,
    or ``cost.json`` differs from ``rollgym report``'s ledger of the same run."""
    from rollgym.collect.cost_ledger import CostLedger

    seconds = [0.5385, 0.6235, 0.6125]
    said = []
    for order in (seconds, seconds[2:] + seconds[:2]):
        ledger = CostLedger(1)
        for i, s in enumerate(order):
            cost = {"calls": 1, "model_s": s, "money": s / 1000, "sandbox_s": s}
            ledger.unscored("failed", cost, 1, s)
            ledger.scored(i, 1.0, False, cost, 1)
        said.append(ledger.to_dict(PriceTable.model_validate(PRICES)))
    assert said[0] == said[1]
    assert said[0]["totals"]["failed_seconds"] == 1.774
