"""NeMo RL's calling pattern, side by side: NeMo Gym 0.7's own ``RunHelper`` and
``RolloutCollectionHelper``, and rollgym's (``rollgym.integrations.nemo_rl``), the same rows.

Opt-in (``INTEROP07_VENV=.interop07-venv``): each side starts its servers the way NeMo RL's
``NemoGym._spinup`` does and collects the rows the way its ``run_rollouts`` does
(``tests/support/nemo_rl.py``, run as a script in each side's venv; see
``interop/ng07_nemo_rl_support.py``).

- mcqa: 0.7's mcqa example rows, each answered right and wrong by rollgym's scripted model,
  and a row whose model call fails. 0.7 runs its mcqa, ``simple_agent`` and ``legacy_agent``
  relay with ``openai_model`` in front of the model; rollgym its mcqa and ``tool_agent``.
  Same reward per row, the fields NeMo RL reads on both; the failing row raises on 0.7 (NeMo
  RL's step fails) and is a masked sample on rollgym (the step goes on).
- token fields: the same rows against two vLLM-shaped ranks (``tests.models.vllm_double``),
  0.7's ``vllm_model`` as NeMo RL's ``vllm_model_for_training.yaml`` sets it up against
  rollgym's ``openai_proxy`` with ``return_token_ids``: the same ids and logprobs per output
  item, and the same turns once NeMo RL's post-processing has read them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from interop import nemo
from interop.ng07_nemo_rl_support import (
    FAIL,
    ROLLGYM_PYTHON,
    SideRun,
    failing,
    mcqa_rows,
    ng07_config,
    ng07_env,
    output_text,
    python_of,
    rollgym_config,
    rollgym_env,
    run_side,
    scripted_app,
    short_tmp,
)
from rollgym.testing import serve_asgi
from tests.models.vllm_double import VllmDouble
from tests.support.background import in_thread

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("INTEROP07_VENV"), reason="opt-in: set INTEROP07_VENV (0.7's venv)"
    ),
    pytest.mark.timeout(1800),
]

TRAINING = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def nemo_rl_cfg(urls: list[str], initial: dict[str, Any], model: str) -> dict[str, Any]:
    """NeMo RL's ``NemoGymConfig``: the model's name, its per-DP-rank URLs, ``env.nemo_gym``."""
    return {"model_name": model, "base_urls": urls, "initial_global_config_dict": initial}


def both_sides(
    gym: nemo.NemoGym, root: Path, urls: list[str], rows: list[dict[str, Any]], *, vllm: bool
) -> tuple[SideRun, SideRun]:
    workspace = nemo.Workspace(root / "ng07", gym)
    model = "toy" if vllm else "rollgym-scripted"
    initial = ng07_config(workspace, model="vllm" if vllm else "openai")
    ray_tmp = short_tmp()
    try:
        theirs = run_side(
            python_of(gym.venv), nemo_rl_cfg(urls, initial, model), rows, workspace.path,
            env=ng07_env(ray_tmp),
        )  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    mine = rollgym_config(model_url=None if vllm else urls[0].removesuffix("/v1"))
    ours = run_side(
        ROLLGYM_PYTHON, nemo_rl_cfg(urls, mine, model), rows, root / "rollgym",
        env=rollgym_env(),
    )  # fmt: skip
    return theirs, ours


# -- mcqa, the scripted model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcqa(
    ng07: nemo.NemoGym, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SideRun, SideRun, list[dict[str, Any]]]]:
    rows = mcqa_rows(ng07)
    with in_thread(serve_asgi(failing(scripted_app(), FAIL))) as model:
        theirs, ours = both_sides(
            ng07, tmp_path_factory.mktemp("nemo_rl_mcqa"), [model + "/v1"], rows, vllm=False
        )
    yield theirs, ours, rows


def test_every_row_pays_what_0_7_pays(mcqa: tuple[SideRun, SideRun, list[Any]]) -> None:
    theirs, ours, rows = mcqa
    scored = [i for i, row in enumerate(rows) if FAIL not in str(row)]
    assert set(theirs.results) == set(ours.results) == set(range(len(rows)))
    rewards = {i: (theirs.results[i]["reward"], ours.results[i]["reward"]) for i in scored}
    assert all(a == b for a, b in rewards.values()), rewards
    assert [rewards[i][0] for i in scored] == [1.0, 0.0] * (len(scored) // 2)  # right, wrong
    for i in scored:
        mine, their = ours.results[i], theirs.results[i]
        assert output_text(mine) == output_text(their)
        assert mine["mask_sample"] is their["mask_sample"] is False
        assert "instance_config" not in mine and "instance_config" not in their


def test_both_sides_hand_nemo_rl_the_fields_it_reads(
    mcqa: tuple[SideRun, SideRun, list[Any]],
) -> None:
    theirs, ours, rows = mcqa
    for i, row in enumerate(rows):
        if FAIL in str(row):
            continue
        for side in (theirs, ours):
            result = side.results[i]
            assert isinstance(result["response"]["output"], list) and result["response"]["output"]
            # The prompt NeMo RL reads back (0.7's agent hands it back normalized, with a
            # "type" on each message; rollgym's as it was sent): the same messages.
            given = result["responses_create_params"]["input"]
            sent = row["responses_create_params"]["input"]
            assert [(m["role"], m["content"]) for m in given] == [
                (m["role"], m["content"]) for m in sent
            ]
            # The scripted model gives no token ids: NeMo RL refuses either side's result alike.
            assert "no generation data" in side.post[i]["error"]
    assert theirs.poll == ours.poll == "ok"


def test_a_failing_row_ends_0_7s_step_and_is_a_masked_sample_on_rollgym(
    mcqa: tuple[SideRun, SideRun, list[Any]],
) -> None:
    theirs, ours, rows = mcqa
    (failed,) = [i for i, row in enumerate(rows) if FAIL in str(row)]
    raised = theirs.results[failed]["raised"]
    assert raised["status"] == 500  # NeMo RL maps it to GymTransportError: the call ends
    result = ours.results[failed]
    assert result["mask_sample"] is True and result["instance_config"] == {"mask_sample": True}
    assert result["reward"] == 0.0 and result["rollgym_error"]["status"] == 502
    assert ours.post[failed]["mask_sample"] is True and ours.post[failed]["turns"]


def test_rollgym_leaves_no_process_behind(mcqa: tuple[SideRun, SideRun, list[Any]]) -> None:
    theirs, ours, _ = mcqa
    assert ours.leftovers == []
    # 0.7 signals the shells around its servers: the servers outlive its shutdown (the sheet's
    # §8). Not asserted: it is 0.7's to fix; shown when this test is run with -rA.
    print(f"0.7 left {len(theirs.leftovers)} processes running: {theirs.leftovers}")


# -- token fields, a vLLM-shaped model ---------------------------------------------------------


@pytest.fixture(scope="module")
def tokens(
    ng07: nemo.NemoGym, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SideRun, SideRun, list[dict[str, Any]]]]:
    rows = mcqa_rows(ng07, failing=False)[::2]
    ranks = [VllmDouble(), VllmDouble()]
    with in_thread(serve_asgi(ranks[0].app)) as a, in_thread(serve_asgi(ranks[1].app)) as b:
        theirs, ours = both_sides(
            ng07, tmp_path_factory.mktemp("nemo_rl_tokens"), [a + "/v1", b + "/v1"], rows,
            vllm=True,
        )  # fmt: skip
    yield theirs, ours, rows


def test_the_token_fields_are_0_7s(tokens: tuple[SideRun, SideRun, list[Any]]) -> None:
    theirs, ours, rows = tokens
    for i in range(len(rows)):
        their_items = [o for o in theirs.results[i]["response"]["output"] if o.get(TRAINING[1])]
        my_items = [o for o in ours.results[i]["response"]["output"] if o.get(TRAINING[1])]
        assert their_items, theirs.post[i]
        assert [[o[f] for f in TRAINING] for o in my_items] == [
            [o[f] for f in TRAINING] for o in their_items
        ]
        assert ours.post[i] == theirs.post[i]  # the same turns, reward and mask for NeMo RL
