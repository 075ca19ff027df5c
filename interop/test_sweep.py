"""The sweep's own logic (``interop/sweep.py``) on NeMo Gym's installed files: no server runs."""

from __future__ import annotations

import json

import pytest

from interop import sweep


def script(row: dict[str, object]) -> list[dict[str, object]]:
    params = row["responses_create_params"]
    assert isinstance(params, dict)
    return json.loads(params["metadata"]["rollgym_script"])


def test_rows_are_the_servers_task_rows_with_its_recorded_outputs() -> None:
    # The recorded rollouts of example_session_state_mgmt lack initial_count/expected_count
    # (seed_session answers 422 without them); the task rows have them.
    rows, source, recorded = sweep.task_rows("example_session_state_mgmt", 3)
    assert source == "replay" and recorded == [1.0, 1.0, 1.0]
    for row in rows:
        assert {"initial_count", "expected_count"} <= set(row)
        assert script(row)[0]["calls"][0]["name"] == "increment_counter"


def test_a_recorded_verify_answer_is_not_sent_back() -> None:
    # hotpotqa_qa's verify builds its answer with extracted_answer=...: a row carrying the
    # recorded one made it answer 500 ("got multiple values for keyword argument").
    rows, _, _ = sweep.task_rows("hotpotqa_qa", 3)
    assert not {"extracted_answer", "reward", "response"} & set(rows[0])


def test_prompts_match_on_their_images_too() -> None:
    # circle_count's rows ask the same question of different images.
    rows, _, recorded = sweep.task_rows("circle_count", 3)
    assert recorded[1] == 1.0
    assert "\\boxed{3}" in script(rows[1])[-1]["say"]


def test_a_replay_starts_after_the_turns_already_in_the_prompt() -> None:
    rows, _, _ = sweep.task_rows("single_step_tool_use_with_argument_comparison", 1)
    turns = sweep.prompt_turns(rows[0])
    assert turns == 1
    assert script(rows[0])[:turns] == [{"say": ""}]
    assert script(rows[0])[turns]["calls"][0]["name"] == "authenticate_user"


@pytest.mark.parametrize(
    ("server", "reason"),
    [
        ("aalcr", "judge_model_server needs a judge model"),
        ("ns_tools", "needs another server"),
    ],
)
def test_servers_needing_another_server_are_not_offline(server: str, reason: str) -> None:
    with pytest.raises(LookupError, match=reason):
        sweep.server_fields(server)


def test_a_judge_switched_off_or_being_the_policy_is_offline() -> None:
    assert sweep.server_fields("math_with_judge")["_variant"] == "judge off"
    assert "policy model" in sweep.server_fields("multichallenge")["_variant"]


def test_start_notes_name_the_cause() -> None:
    log = (
        "Traceback (most recent call last):\n"
        "ModuleNotFoundError: No module named 'human_eval_infilling'\n"
        "    raise RuntimeError(print_str)\n"
        "RuntimeError: Process `code_fim` finished unexpectedly!\n"
    )
    assert sweep.start_note(log).startswith("not offline: needs package 'human_eval_infilling'")
    clone = (
        "subprocess.CalledProcessError: Command '['git', 'clone', '--quiet', "
        "'https://github.com/allenai/IFBench.git', '/x']' returned non-zero exit status 128.\n"
    )
    assert sweep.start_note(clone).startswith(
        "not offline: clones https://github.com/allenai/IFBench.git"
    )
    hung = "gym env start failed: nothing listens on 127.0.0.1:1 after 120 s\nKeyboardInterrupt\n"
    note = sweep.start_note(hung, "(ccc) CCC: pre-loading metadata (~27 GB, ~46s)\n")
    assert note.startswith("never came up") and "27 GB" in note
