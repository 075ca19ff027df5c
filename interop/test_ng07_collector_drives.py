"""rollgym's collector (``rollgym collect``) drives NeMo Gym 0.7's own Environment Servers:
its ``legacy_agent`` relay (flat rows, forwarded to ``simple_agent``'s ``/run``) and its
``single_agent_turn`` (materialized rows, as episodes), both in front of 0.7's ``mcqa`` and
``simple_agent``, with rollgym's scripted model behind 0.7's ``openai_model``. 0.7's own
collector (``gym eval run --no-serve``) runs the same file against the same stack; both runs
must read the same: the same reward per rollout, the same rollouts failed, and for an episode's
failure the same ``terminal`` and ``stage``.

Opt-in: skipped unless ``INTEROP07_VENV`` names the 0.7 venv (``interop/setup.sh --nemo 0.7``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from interop import nemo
from interop.conftest import Ng07Stacks
from interop.gym_eval import EvalRun, eval_run
from interop.ng07_collector_support import (
    EPISODES,
    FAILS,
    RELAY,
    CollectRun,
    Key,
    error_fields,
    rollgym_collect,
    stack_config,
    task_rows,
)
from interop.rollgym_side import ROLLGYM, read_jsonl, write_config, write_jsonl

pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        not os.environ.get("INTEROP07_VENV"), reason="opt-in: set INTEROP07_VENV (0.7's venv)"
    ),
]

REPEATS = 2


@pytest.fixture(scope="module")
def stack(ng07_stack: Ng07Stacks) -> nemo.GymStack:
    return ng07_stack(stack_config(), name="ng07_collector_drives")


@pytest.fixture(scope="module")
def runs(
    stack: nemo.GymStack, tmp_path_factory: pytest.TempPathFactory
) -> tuple[EvalRun, CollectRun]:
    """The same file through 0.7's collector and through rollgym's, once each."""
    rows, _ = task_rows()
    root = tmp_path_factory.mktemp("drives")
    theirs = eval_run(
        stack, rows, root / "ng07", f"+num_repeats={REPEATS}", "+route_failures_to_sidecar=true",
        "+num_samples_in_parallel=4", "+environment_server_routes={mcqa\\:example: " + EPISODES + "}",
    )  # fmt: skip
    ours = rollgym_collect(stack.urls, rows, root / "rollgym", "--repeats", str(REPEATS))
    return theirs, ours


def expected() -> dict[Key, float | str]:
    _, does = task_rows()
    return {(t, r): what for (t, _), what in does.items() for r in range(REPEATS)}


def test_the_stack_has_both_environment_servers(stack: nemo.GymStack) -> None:
    assert {RELAY, EPISODES} <= set(stack.urls)


def test_the_same_reward_per_rollout(runs: tuple[EvalRun, CollectRun]) -> None:
    theirs, ours = runs
    assert theirs.code == 0, theirs.output
    assert ours.code == 1, ours.output  # completed, with the failing rows recorded as failures
    want = expected()
    reference, mine = theirs.by_key(), ours.by_key()
    assert set(reference) == set(mine) == set(want)  # every rollout once, on both sides
    scored = sorted(k for k, what in want.items() if what != FAILS)
    assert [reference[k].get("reward") for k in scored] == [want[k] for k in scored]
    assert [mine[k].get("reward") for k in scored] == [reference[k]["reward"] for k in scored]
    # A materialized row's record names its task, as 0.7's does.
    for key in scored:
        assert mine[key].get("_ng_task_id") == reference[key].get("_ng_task_id"), key


def test_the_same_rollouts_fail_and_none_is_scored(runs: tuple[EvalRun, CollectRun]) -> None:
    theirs, ours = runs
    failed = {k for k, what in expected().items() if what == FAILS}
    assert {(f["_ng_task_index"], f["_ng_rollout_index"]) for f in theirs.failures} == failed
    assert {(f["_ng_task_index"], f["_ng_rollout_index"]) for f in ours.failures} == failed
    assert not any(k in failed for k in ((r["_ng_task_index"], r["_ng_rollout_index"])
                                         for r in ours.rollouts))  # fmt: skip


def test_an_episodes_failure_keeps_terminal_and_stage(runs: tuple[EvalRun, CollectRun]) -> None:
    """single_agent_turn calls the model's failure retryable (terminal false, stage agent):
    rollgym tries the episode again as attempts 1 and 2 (the server's default 3 attempts),
    then records what 0.7 records in its sidecar."""
    theirs, ours = runs
    reference, mine = theirs.by_key(), ours.by_key()
    episodes = [k for k in mine if "_ng_task_id" in mine[k] and k in reference
                and "_ng_failure_class" in reference[k]]  # fmt: skip
    assert len(episodes) == REPEATS
    for key in episodes:
        fields = error_fields(mine[key])
        assert fields["type"] == "environment_failure", fields
        assert fields["terminal"] is reference[key]["_ng_failure_terminal"] is False
        assert fields["stage"] == reference[key]["_ng_failure_stage"] == "agent"
        assert fields["server"] == EPISODES
        assert mine[key]["attempts"] == 3
        assert mine[key]["_ng_task_id"] == reference[key]["_ng_task_id"]


def test_a_relayed_failure_is_the_agents_500(runs: tuple[EvalRun, CollectRun]) -> None:
    """The relay hands back simple_agent's 500 as it is: rollgym records an HTTP 500 of the
    relay, 0.7 an ``agent_run_error`` sidecar row with the same status."""
    theirs, ours = runs
    reference, mine = theirs.by_key(), ours.by_key()
    relayed = [k for k in mine if "_ng_task_id" not in mine[k] and "error" in mine[k]]
    assert len(relayed) == REPEATS
    for key in relayed:
        assert mine[key]["error"]["status"] == reference[key].get("_ng_failure_http_status") == 500
        assert mine[key]["error"]["server"] == RELAY


def test_rollgyms_run_keeps_the_ledger_invariant(runs: tuple[EvalRun, CollectRun]) -> None:
    _, ours = runs
    tasks = (ours.out / "tasks.jsonl").read_text().splitlines()
    keys = [(r["task_index"], r["rollout_index"]) for r in ours.rollouts + ours.failures]
    assert len(keys) == len(set(keys)) == len(tasks) == len(expected())


def test_the_native_environment_server_given_as_an_agent_stops_the_run_saying_how(
    stack: nemo.GymStack, tmp_path: Path
) -> None:
    """A newcomer's first try: 0.7's ``single_agent_turn`` declared ``kind: agent`` and given
    flat rows. 0.7 answers each row 422 (``episode_id`` missing); rollgym stops at once with the
    config key to change and the rows it takes (``kind: environment`` with the same rows
    materialized is what ``test_the_same_reward_per_rollout`` runs)."""
    flat = [r for r in task_rows()[0] if "task_id" not in r]
    config = {
        "servers": {EPISODES: {"kind": "agent", "url": stack.urls[EPISODES]}},
        "collect": {"concurrency": 1, "rollout_timeout": 60},
    }
    root = tmp_path
    cfg = write_config(root / "rollgym.yaml", config)
    tasks = write_jsonl(root / "tasks.jsonl", flat)
    done = subprocess.run(
        [ROLLGYM, "collect", str(cfg), "--input", str(tasks), "--output", str(root / "out"),
         "--agent", EPISODES],
        capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"servers.{EPISODES}.kind: environment" in output, output
    (first, *_) = read_jsonl(root / "out" / "failures.jsonl")
    assert first["error"]["type"] == "config_error" and first["error"]["status"] == 422
