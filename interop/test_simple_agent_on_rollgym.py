"""NeMo Gym's ``simple_agent`` runs against rollgym's stateful ``lookup`` environment (launched
by ``gym env start`` like one of its own servers) and scores as rollgym's agent does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interop.conftest import Stacks
from interop.rollgym_side import read_jsonl
from interop.rollouts import nemo_agent_rewards, rollgym_rewards, run_log, scripted
from rollgym.envs import lookup

pytestmark = pytest.mark.timeout(600)
DATA = Path(lookup.__file__).with_name("data") / "example.jsonl"


def lookup_rows() -> list[dict]:
    """Every bundled row once per answer its script offers (right and wrong ones), each as a
    one-answer script, so both agents get exactly the same model outputs."""
    rows = []
    for row in read_jsonl(DATA)[:8]:
        script = json.loads(row["responses_create_params"]["metadata"]["rollgym_script"])
        *calls, last = script
        for answer in last["say"]:
            rows.append(scripted(row, [*calls, {"say": answer}]))
    return rows


def test_simple_agent_scores_rollgym_lookup_as_rollgym(stacks: Stacks, out: Path) -> None:
    rows = lookup_rows()
    nemo = nemo_agent_rewards(stacks.nemo["rollgym_lookup_simple_agent"], rows)
    assert all(status == 200 for status, _ in nemo), nemo
    code, rollouts = rollgym_rewards(
        stacks.rollgym["model"], stacks.nemo["rollgym_lookup"], rows, out
    )
    assert code in (0, 1), run_log(out)
    ours = [r["reward"] if r else None for r in rollouts]
    assert [reward for _, reward in nemo] == ours
    assert 0.0 in ours and 1.0 in ours  # both outcomes occur: agreement is not trivial


def test_simple_agent_without_lookup_scores_zero(stacks: Stacks) -> None:
    """lookup is stateful: an answer given without consulting the registry in this session
    does not pay, through NeMo Gym's agent too (its cookie carries rollgym's session)."""
    row = read_jsonl(DATA)[0]
    script = json.loads(row["responses_create_params"]["metadata"]["rollgym_script"])
    right = [s for s in script[-1]["say"] if row["expected_answer"] in s.replace(",", "")]
    nemo = nemo_agent_rewards(
        stacks.nemo["rollgym_lookup_simple_agent"],
        [scripted(row, [*script[:-1], {"say": right[0]}]), scripted(row, [{"say": right[0]}])],
    )
    assert nemo == [(200, 1.0), (200, 0.0)]
