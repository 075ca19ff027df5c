"""The pure half of the verifiers bridge (``rollgym.integrations.verifiers``): no verifiers here.

The verify response and the tool list come from the environment and, through it, from model
output: each check below is something a verify answer or a row could do to turn a failure into
a reward, or a model call into a call of ``/verify``."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.errors import ConfigError, HTTPStatusError, InputError, ProtocolError
from rollgym.integrations.verifiers import (
    Verdict,
    bundled_dataset,
    failure_fields,
    load_rows,
    mcp_tools,
    recorded_failure,
    verdict,
)
from rollgym.wire import RESERVED_ENDPOINTS

# -- verdict --------------------------------------------------------------------------------


def test_a_verdict_keeps_the_reward_and_the_numeric_fields_as_metrics() -> None:
    verified = {
        "responses_create_params": {"input": "q"},
        "response": {"output": []},
        "expected_answer": "48213",
        "reward": 1,
        "tool_called": 1,
        "accuracy": 0.5,
        "passed": True,  # a bool is no metric
        "task_index": 3,  # nor are indices
        "nan_metric": float("nan"),
        "reason": "fine",
    }
    got = verdict(verified, server="lookup")
    assert got == Verdict(
        1.0,
        {"tool_called": 1.0, "accuracy": 0.5},
        {
            "expected_answer": "48213",
            "tool_called": 1,
            "accuracy": 0.5,
            "passed": True,
            "task_index": 3,
            "nan_metric": got.info["nan_metric"],
            "reason": "fine",
        },
    )
    assert isinstance(got.reward, float)


@pytest.mark.parametrize(
    "reward",
    [None, True, False, "1.0", [1.0], {"value": 1}, float("nan"), float("inf"), -float("inf")],
)
def test_a_reward_that_is_no_finite_number_is_a_protocol_error(reward: Any) -> None:
    verified: dict[str, Any] = {"reward": reward}
    with pytest.raises(ProtocolError) as caught:
        verdict(verified, server="lookup")
    assert caught.value.server == "lookup"
    assert caught.value.endpoint == "/verify"


def test_a_missing_reward_or_an_answer_that_is_no_object_is_a_protocol_error() -> None:
    for answer in ({}, {"score": 1.0}, [{"reward": 1.0}], "1.0", 1.0, None):
        with pytest.raises(ProtocolError):
            verdict(answer)


def test_an_integer_past_floats_range_is_refused_not_an_overflow() -> None:
    with pytest.raises(ProtocolError):
        verdict({"reward": 10**400})
    assert verdict({"reward": 1, "big": 10**400}).metrics == {}


@pytest.mark.parametrize(
    "verified",
    [
        {"reward": 0.0, "mask_sample": True},
        {"reward": 1.0, "instance_config": {"mask_sample": True}},
        {"reward": 1.0, "mask_sample": False, "instance_config": {"mask_sample": True}},
    ],
)
def test_a_masked_verdict_is_refused_rather_than_scored(verified: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match="mask_sample: true"):
        verdict(verified, server="judge")


@pytest.mark.parametrize("flag", ["true", 1, "yes", [True]])
def test_a_mask_sample_that_is_no_boolean_is_not_guessed(flag: Any) -> None:
    with pytest.raises(ProtocolError, match="no boolean"):
        verdict({"reward": 1.0, "mask_sample": flag})


def test_mask_sample_false_is_a_measurement() -> None:
    assert verdict({"reward": 0.0, "mask_sample": False}).reward == 0.0


# -- tools ------------------------------------------------------------------------------------

LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Look up a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    "strict": False,
}


def test_responses_function_tools_become_mcp_specs() -> None:
    assert mcp_tools([LOOKUP]) == [
        {
            "name": "lookup",
            "description": "Look up a key.",
            "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}},
        }
    ]


def test_chat_style_tools_are_read_too() -> None:
    chat = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}
    assert mcp_tools([chat]) == [
        {"name": "echo", "description": None, "input_schema": {"type": "object"}}
    ]


def test_names_that_reach_a_servers_own_endpoints_are_no_tools() -> None:
    hostile = [
        {**LOOKUP, "name": name}
        for name in [*sorted(RESERVED_ENDPOINTS), "../verify", "verify?x=1", "a b", "", "1x"]
    ]
    assert mcp_tools(hostile) == []


def test_a_tool_is_offered_only_under_a_name_an_episode_would_call() -> None:
    # One rule (rollgym.protocol.is_tool_name): isidentifier() let these through, to be
    # offered to the model and then refused by the episode at every call.
    names = [
        "_session", "__init__", "VERIFY", "Seed_Session", "\uff56\uff45\uff52\uff49\uff46\uff59",
        "verify\u200b", "\u00f1ame", "x" * 65, "startup",
    ]  # fmt: skip
    kept = ["get_weather", "Lookup2", "x" * 64]
    specs = mcp_tools([{**LOOKUP, "name": name} for name in [*names, *kept]])
    assert [spec["name"] for spec in specs] == kept


def test_junk_tools_are_skipped_and_duplicates_kept_once() -> None:
    tools = [
        None,
        "lookup",
        {"type": "web_search"},
        {"type": "function"},
        {"type": "function", "name": 7},
        {**LOOKUP, "parameters": "not a schema", "description": ["no"]},
        {**LOOKUP, "description": "a second lookup"},
    ]
    assert mcp_tools(tools) == [
        {
            "name": "lookup",
            "description": None,
            "input_schema": {"type": "object", "properties": {}},
        }
    ]


# -- rows -------------------------------------------------------------------------------------


def test_rows_load_from_a_task_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [
        {"responses_create_params": {"input": f"q{i}"}, "expected_answer": str(i)} for i in (1, 2)
    ]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n\n")
    assert load_rows(path) == rows


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "responses_create_params.input"),
        (b'{"responses_create_params": "x"}', "responses_create_params.input"),
        (b'{"responses_create_params": {"tools": []}}', "responses_create_params.input"),
    ],
)
def test_a_malformed_row_names_its_file_and_line(tmp_path: Path, line: bytes, why: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"responses_create_params": {"input": "ok"}}\n' + line + b"\n")
    with pytest.raises(InputError, match=why) as caught:
        load_rows(path)
    assert f"{path}:2" in caught.value.message


def test_an_empty_or_missing_task_file_is_a_config_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match="no rows"):
        load_rows(empty)
    with pytest.raises(ConfigError, match="cannot read"):
        load_rows(tmp_path / "absent.jsonl")


def test_bundled_environments_have_their_example_rows() -> None:
    rows = load_rows(bundled_dataset("lookup"))
    assert rows and all("expected_answer" in r for r in rows)
    for name in ("../lookup", "lookup/../mcqa", "nonesuch", ""):
        with pytest.raises(ConfigError, match="known"):
            bundled_dataset(name)


# -- failures in the rollout state ------------------------------------------------------------


def test_a_recorded_failure_comes_back_with_its_type_and_fields() -> None:
    error = HTTPStatusError(
        "resources answered 500 on POST /lookup", status=500, server="lookup",
        endpoint="/lookup", body='{"error": "boom"}', attempts=3,
    )  # fmt: skip
    fields = failure_fields(error)
    # the rollout state is JSON between the tool server and the host
    back = recorded_failure(orjson.loads(orjson.dumps(fields)))
    assert type(back) is HTTPStatusError
    assert back.to_dict() == error.to_dict()
    assert pickle.loads(pickle.dumps(back)).to_dict() == error.to_dict()


@pytest.mark.parametrize("junk", [None, "boom", {"message": "no type"}, {"type": 5}, [1]])
def test_an_unreadable_failure_record_is_still_a_failure(junk: Any) -> None:
    assert isinstance(recorded_failure(junk), ProtocolError)


def test_the_pure_module_does_not_import_verifiers() -> None:
    code = (
        "import sys, rollgym.integrations.verifiers as v; "
        "assert 'verifiers' not in sys.modules and not any("
        "m.startswith('verifiers.') for m in sys.modules), sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
