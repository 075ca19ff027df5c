"""rollgym's lookup environment through the real verifiers 0.4 (v1), as prime-rl would load it.

Opt-in: skipped unless ``VERIFIERS_PYTHON`` names a Python that can ``import verifiers`` (it
does not go into rollgym's venv: it pins its own openai, mcp, pydantic-config, ...). The script
``verifiers_run.py`` runs in that Python: it loads the Hub package ``rollgym-env`` through
verifiers' loader and runs 9 rows x 2 rollouts through ``env.serving()`` + ``env.run_slot`` with
verifiers' ``null`` chat harness (a uv script verifiers prepares: ``uv`` must be on PATH beside
that Python, and the harness's packages are fetched from PyPI by uv once), against a rollgym
resources server and rollgym's scripted model on 127.0.0.1; then the same rows through rollgym's
tool agent. About 3 minutes on 2 cores::

    python3.11 -m venv /tmp/vf-venv
    /tmp/vf-venv/bin/pip install -r tests/integrations/verifiers_requirements.txt -e .
    VERIFIERS_PYTHON=/tmp/vf-venv/bin/python .venv/bin/pytest -q tests/integrations/test_verifiers.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

PYTHON = os.environ.get("VERIFIERS_PYTHON", "")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

pytestmark = [
    pytest.mark.skipif(
        not PYTHON, reason="opt-in: set VERIFIERS_PYTHON to a Python with verifiers 0.4 installed"
    ),
    pytest.mark.timeout(700),  # the first test waits for the whole run (about 3 minutes)
]

# Row indices of verifiers_run.ROWS (read here from the script's output, not imported: the
# script imports verifiers).
SCORED = [0, 1, 2, 3]
TOOL_SERVER_FAILS, VERIFY_FAILS, MASKED, NO_TOOLS, SEED_FAILS = 4, 5, 6, 7, 8


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("verifiers")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE / "verifiers_env")]),
        # verifiers' chat harness is a uv script: uv beside the venv's Python, no managed
        # Python downloads, and a cache of this test's own unless the caller names one.
        "PATH": os.pathsep.join([str(Path(PYTHON).parent), os.environ.get("PATH", "")]),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(workdir / "uv-cache"),
    }
    done = subprocess.run(
        [PYTHON, str(HERE / "verifiers_run.py"), str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_rewards_equal_rollgyms_own_for_the_same_model_outputs(run: dict[str, Any]) -> None:
    seen = []
    for index in SCORED:
        ours = run["rollgym"][index]
        for trace in run["verifiers"][index]:
            assert trace["ok"], trace["errors"]
            assert trace["errors"] == []
            assert trace["rewards"] == {"rollgym": ours["reward"]}
            assert trace["last_reply"] == ours["text"]  # the same model output ...
            # ... and the verifier's metric (a lookup of a key that is not there, as row 3's
            # Atlantis, found nothing: not a use of the tool)
            assert trace["metrics"] == {"tool_called": ours["tool_called"]}
            seen.append(ours["reward"])
    assert sorted(set(seen)) == [0.0, 1.0]  # real zeros and real ones, both measured


def test_each_rollout_has_its_own_session(run: dict[str, Any]) -> None:
    seeded = [t for i, group in enumerate(run["verifiers"]) if i != SEED_FAILS for t in group]
    sessions = [t["session_id"] for t in seeded]
    assert all(sessions) and len(set(sessions)) == len(seeded) == 16
    calls = run["sessions"]
    # no call outside a rollout's session ("-"); the two seeds that failed opened no other
    unseeded = set(calls) - set(sessions)
    assert "-" not in calls and len(unseeded) == 2
    assert all(calls[s] == ["seed"] for s in unseeded)
    for index, (row, group) in enumerate(zip(run["rows"], run["verifiers"], strict=True)):
        if index == SEED_FAILS:
            continue
        question = row["responses_create_params"]["input"][0]["content"]
        for trace in group:
            log = calls[trace["session_id"]]
            # seeded once, the rollout's own tool call, then verified once (or not at all,
            # when the tool's server failed and the rollout stopped)
            assert log[:2] == ["seed", f"lookup:{question}"]
            assert log[2:] == (
                [] if trace["stop_condition"] == "tool_server_failed" else ["verify"]
            )


def test_a_failing_tool_server_fails_the_rollout_not_a_zero(run: dict[str, Any]) -> None:
    assert run["rollgym"][TOOL_SERVER_FAILS]["failed"] == "http_status"
    for trace in run["verifiers"][TOOL_SERVER_FAILS]:
        assert trace["ok"] is False
        assert trace["rewards"] == {"rollgym": None}  # "scoring didn't run"
        assert trace["stop_condition"] == "tool_server_failed"  # stopped at the next model call
        assert trace["tool_calls"] == []
        (error,) = trace["errors"]
        assert error["type"] == "TaskError"
        assert "resources answered 500 on POST /lookup" in error["message"]
        assert trace["rollgym_error"]["type"] == "http_status"
        assert trace["rollgym_error"]["status"] == 500
        assert trace["rollgym_error"]["endpoint"] == "/lookup"


def test_a_failing_verifier_fails_the_rollout_not_a_zero(run: dict[str, Any]) -> None:
    assert run["rollgym"][VERIFY_FAILS]["failed"] == "http_status"
    for trace in run["verifiers"][VERIFY_FAILS]:
        assert trace["ok"] is False
        assert trace["rewards"] == {"rollgym": None}
        (error,) = trace["errors"]
        assert error["type"] == "TaskError"
        assert "resources answered 500 on POST /verify" in error["message"]
        assert trace["rollgym_error"]["endpoint"] == "/verify"


def test_a_masked_verdict_is_no_reward(run: dict[str, Any]) -> None:
    # rollgym keeps the masked rollout with its flag (trainers drop it); verifiers has no such
    # flag, so the rollout is recorded failed there rather than scored with a placeholder.
    assert run["rollgym"][MASKED]["masked"] is True
    for trace in run["verifiers"][MASKED]:
        assert trace["ok"] is False
        assert trace["rewards"] == {"rollgym": None}
        assert "mask_sample: true" in trace["errors"][0]["message"]
        assert trace["rollgym_error"]["type"] == "protocol_error"


def test_tools_come_from_the_server_when_a_row_declares_none(run: dict[str, Any]) -> None:
    for trace in run["verifiers"][NO_TOOLS]:
        assert trace["ok"], trace["errors"]
        assert trace["tools_seen"] == ["lookup"]
        assert trace["rewards"] == {"rollgym": 1.0}


def test_a_failing_seed_fails_the_rollout_before_it_runs(run: dict[str, Any]) -> None:
    assert run["rollgym"][SEED_FAILS]["failed"] == "http_status"
    for trace in run["verifiers"][SEED_FAILS]:
        assert trace["ok"] is False
        assert trace["rewards"] == {}  # scoring never ran: no reward entry at all
        assert trace["session_id"] is None and trace["tool_calls"] == []
        assert trace["last_reply"] == ""  # the model was never called
        (error,) = trace["errors"]
        assert error["type"] == "TaskError"
        assert "task setup" in error["message"]
        assert trace["rollgym_error"]["endpoint"] == "/seed_session"
