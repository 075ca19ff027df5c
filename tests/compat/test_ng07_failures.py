"""NeMo Gym 0.7's failure vocabulary on rollgym's errors (``rollgym.nemo_gym.failures``).

Every error type has a ``failure_kind`` among 0.7's 22 names; real failures, made by real
servers on 127.0.0.1, read in 0.7's vocabulary with the stage, delivery and terminal rollgym
knows; 0.7's handled failures become ``EnvironmentFailure`` and keep ``terminal``, ``stage``,
``failure_kind`` and ``partial_response`` through pickle, JSON and ``failures.jsonl``; and what
rollgym writes passes 0.7's own models (run in the 0.7 interop venv, when there is one).
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import pickle
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym import errors
from rollgym.collect import Collector, prepare_run
from rollgym.collect.dialect import Dialects
from rollgym.collect.ledger import Ledger
from rollgym.collect.metrics import compute_metrics
from rollgym.collect.records import FailedRollout
from rollgym.dialects import ROW_DIALECTS
from rollgym.envs.judge.server import JudgeEnv
from rollgym.errors import (
    ALL_ERRORS,
    PARTIAL_LIMIT,
    AnswerTooLarge,
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    DeadlineExceeded,
    EnvironmentFailure,
    HTTPStatusError,
    InternalError,
    LaunchError,
    ProtocolError,
    ReadTimeout,
    RollgymError,
)
from rollgym.http import Target
from rollgym.nemo_gym.failures import (
    FAILURE_KINDS,
    KIND_BY_TYPE,
    STAGES,
    delivery,
    episode_failure,
    error_from_failure,
    failure_class,
    failure_kind,
    failure_stage,
    record_fields,
    sidecar_fields,
    terminal,
)
from rollgym.nemo_gym.wire import NG_FAILURE_CLASS, NG_FAILURE_TERMINAL
from rollgym.report import load_run
from rollgym.server.resources import Session
from rollgym.testing import serve_server
from rollgym.trainer import RolloutClient
from rollgym.wire import NG_TASK_INDEX
from tests.envs.env_client import reply
from tests.support.ledger import assert_ledger_invariant, read_jsonl
from tests.support.servers import FAIL_MARKER, CountingEcho, FaultyModel
from tests.support.stack import fast_policy, running_stack, stack_config, task_row, write_tasks

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
NG07 = ROOT / ".interop07-venv"
NG07_PYTHON = NG07 / "bin" / "python"
NG07_KINDS = NG07 / "lib" / "python3.13" / "site-packages" / "nemo_gym" / "failure_kinds.py"


def _subclasses(cls: type[RollgymError]) -> list[type[RollgymError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        if sub.__module__ == errors.__name__:
            out.extend(_subclasses(sub))
    return out


ERROR_CLASSES = sorted(set(_subclasses(RollgymError)), key=lambda c: c.__name__)


# -- the vocabulary -----------------------------------------------------------------------------


@pytest.mark.skipif(not NG07_KINDS.exists(), reason="no NeMo Gym 0.7 interop venv here")
def test_the_names_and_stages_are_0_7s() -> None:
    tree = ast.parse(NG07_KINDS.read_text())
    constants: dict[str, str] = {}
    kinds: set[str] = set()
    stages: tuple[str, ...] = ()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                constants[name] = value.value
            if name == "FailureStage":
                assert isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Tuple)
                stages = tuple(e.value for e in value.slice.elts if isinstance(e, ast.Constant))
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "FAILURE_KINDS":
            assert isinstance(node.value, ast.Call)
            items = node.value.args[0]
            assert isinstance(items, ast.Set)
            kinds = {constants[e.id] for e in items.elts if isinstance(e, ast.Name)}
    assert len(kinds) == 22
    assert kinds == FAILURE_KINDS
    assert stages == STAGES


def test_every_error_type_of_the_tree_has_a_kind() -> None:
    # A new error class that nobody mapped fails here, not in a 0.7 reader.
    assert set(KIND_BY_TYPE) == {c.type for c in ALL_ERRORS}
    assert set(KIND_BY_TYPE.values()) <= FAILURE_KINDS
    for cls in ERROR_CLASSES:
        assert cls.type in KIND_BY_TYPE, cls.__name__


def _where(err: RollgymError, how: str) -> RollgymError:
    """``err`` (of server ``x``) as the collector would see it: alone, or reported through the
    agent's ``/run`` from one hop of the rollout."""
    hops = {
        "model": ("model", "/v1/responses"),
        "seed": ("env", "/seed_session"),
        "verify": ("env", "/verify"),
        "judge": ("env", "/verify"),
        "cleanup": ("env", "/close_session"),
        "prefixed": ("env", "/ng-rollout/r1/verify"),
    }
    if how == "alone":
        return err
    server, endpoint = hops[how]
    inner = err.with_fields(server="judge_model" if how == "judge" else server)
    hop = HTTPStatusError("hop", status=502, server=server, endpoint=endpoint, origin=inner)
    return HTTPStatusError("run", status=502, server="agent", endpoint="/run", origin=hop)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "how", ["alone", "model", "seed", "verify", "judge", "cleanup", "prefixed"]
)
def test_every_error_reads_as_one_of_0_7s_names_wherever_it_happened(
    cls: type[RollgymError], how: str
) -> None:
    err = _where(cls("it failed", server="x"), how)
    assert failure_kind(err) in FAILURE_KINDS
    assert isinstance(terminal(err), bool)
    assert delivery(err) in ("not_sent", "possibly_delivered", "delivered")
    assert failure_stage(err) in (*STAGES, None)
    fields = sidecar_fields(err)
    assert fields[NG_FAILURE_CLASS] in (
        "agent_run_error", "agent_request_failed", "environment_server_failed",
    )  # fmt: skip
    assert orjson.loads(orjson.dumps(episode_failure(err)))["failure_kind"] in FAILURE_KINDS


def test_the_stage_refines_the_kind_as_the_table_says() -> None:
    internal = InternalError("bug", server="x")
    assert failure_kind(_where(internal, "alone")) == "agent_run_error"
    assert failure_kind(_where(internal, "verify")) == "verifier_error"
    assert failure_kind(_where(internal, "prefixed")) == "verifier_error"  # 0.7's prefix
    assert failure_kind(_where(internal, "judge")) == "judge_failed"
    assert failure_kind(_where(internal, "cleanup")) == "session_release_failed"
    assert failure_stage(_where(internal, "seed")) == "seed"
    timeout = ReadTimeout("slow", server="x")
    assert failure_kind(_where(timeout, "model")) == "transport_timeout"
    assert failure_kind(_where(timeout, "verify")) == "transport_timeout"  # reaching the verifier
    assert failure_kind(_where(timeout, "judge")) == "judge_failed"  # the judge call failed
    # A proxy in front of the agent answering 503, no rollgym error behind it: no rollout ran.
    proxy = HTTPStatusError("busy", status=503, server="agent", endpoint="/run")
    assert failure_kind(proxy) == failure_class(proxy) == "agent_request_failed"
    # An open circuit or a spent budget names the failure it stopped.
    last = ConnectError("refused", server="model", endpoint="/v1/responses")
    held = CircuitOpen("open", server="model", endpoint="/v1/responses", origin=last)
    assert failure_kind(held) == "transport_unreachable"
    spent = BudgetExhausted(
        "spent", server="model", origin=ReadTimeout("slow", server="model", retryable=True)
    )
    assert failure_kind(spent) == "transport_timeout" and terminal(spent) is False


def test_delivery_is_what_the_transport_knows() -> None:
    refused = ConnectError("refused", server="agent", endpoint="/run")
    assert delivery(refused) == "not_sent"
    assert delivery(CircuitOpen("open", server="agent")) == "not_sent"
    # The circuit opened after an attempt that was answered: that call reached the server.
    answered = HTTPStatusError("500", status=500, server="agent", endpoint="/run")
    assert delivery(CircuitOpen("open", server="agent", origin=answered)) == "delivered"
    assert delivery(BudgetExhausted("spent", server="agent", origin=refused)) == "not_sent"
    lost = ReadTimeout("slow", server="agent")
    assert delivery(lost) == "possibly_delivered"
    assert delivery(DeadlineExceeded("out", server="agent", origin=lost)) == "possibly_delivered"
    assert delivery(DeadlineExceeded("out", server="agent", origin=answered)) == "delivered"
    assert delivery(AnswerTooLarge("big", status=200, server="agent")) == "delivered"
    assert delivery(ProtocolError("no reward", server="agent")) == "delivered"
    assert delivery(LaunchError("never up", server="agent")) == "not_sent"
    assert delivery(EnvironmentFailure("x", server="env")) == "delivered"  # 0.7 requires it


def test_terminal_is_rollgyms_retry_judgement() -> None:
    def status(code: int, retryable: bool = True) -> HTTPStatusError:
        return HTTPStatusError("s", status=code, server="model", retryable=retryable)

    assert terminal(status(400)) and terminal(status(404))  # a 4xx: the same again
    assert not terminal(status(429)) and not terminal(status(408))
    assert not terminal(status(500))  # transient: the client said a caller may run it again
    assert terminal(status(500, retryable=False))
    assert not terminal(ReadTimeout("slow", server="model"))
    assert not terminal(ConnectError("refused", server="model"))
    assert terminal(InternalError("bug", server="env"))  # 0.7: an unhandled error is terminal
    assert terminal(EnvironmentFailure("x", terminal=True)) is True
    assert terminal(EnvironmentFailure("x", terminal=False)) is False


# -- real failures, from real servers -----------------------------------------------------------


class BrokenVerify(CountingEcho):
    async def verify(self, session: Session, task: dict[str, Any], response: dict[str, Any]) -> Any:
        raise RuntimeError("verifier bug")


Read = tuple[str, str | None, str, bool, str]
"""(failure_kind, stage, delivery, terminal, _ng_failure_class)"""


def _read(record: Any) -> Read:
    assert isinstance(record, FailedRollout), record
    err = record.error
    return failure_kind(err), failure_stage(err), delivery(err), terminal(err), failure_class(err)


async def test_real_failures_read_in_0_7s_vocabulary(
    tmp_path: Path, dead_url: Callable[[], str]
) -> None:
    got: dict[str, Read] = {}
    hold = tmp_path / "hold"
    hold.touch()
    async with running_stack(
        model_options={"fail_marker": FAIL_MARKER, "hold_while_exists": str(hold)}
    ) as stack:
        client = RolloutClient(stack.agent_url)
        try:
            # The model holds every request while the file exists: the rollout's deadline.
            got["deadline"] = _read(await client.run(task_row(0), rollout_timeout=1.0))
            hold.unlink()
            got["model 500"] = _read(await client.run(task_row(1, fail=True)))
            got["bad row"] = _read(await client.run({"responses_create_params": 3}))
        finally:
            hold.unlink(missing_ok=True)  # a held request must not outlive the test
            await client.aclose()
    async with running_stack(env=BrokenVerify) as stack, RolloutClient(stack.agent_url) as client:
        got["verifier bug"] = _read(await client.run(task_row(0)))
    async with RolloutClient(dead_url()) as client:
        got["agent down"] = _read(await client.run(task_row(0)))
    async with judge_stack() as agent_url, RolloutClient(agent_url) as client:
        row = {
            "responses_create_params": {
                "input": "Capital of France?",
                "metadata": {"rollgym_script": [{"say": "Paris"}]},
            },
            "expected_answer": "Paris",
        }
        got["judge down"] = _read(await client.run(row))
    assert got == {
        "deadline": ("agent_timeout", None, "possibly_delivered", False, "agent_request_failed"),
        "model 500": ("agent_run_error", "agent", "delivered", False, "agent_run_error"),
        "bad row": ("agent_request_failed", None, "delivered", True, "agent_request_failed"),
        "verifier bug": ("verifier_error", "verification", "delivered", True, "agent_run_error"),
        "agent down": ("transport_unreachable", None, "not_sent", False, "agent_request_failed"),
        "judge down": ("judge_failed", "verification", "delivered", False, "agent_run_error"),
    }


@asynccontextmanager
async def judge_stack() -> AsyncIterator[str]:
    """A tool agent whose environment is ``JudgeEnv``, whose judge model answers 500 to every
    judging prompt (they all hold ``GOLD``)."""
    async with (
        serve_server("scripted", name="policy") as (policy_url, _),
        serve_server(FaultyModel, name="judge_model", options={"fail_marker": "GOLD"}) as (
            judge_url,
            _,
        ),
    ):
        judge_peer = {"judge_model": Target("judge_model", (judge_url,), fast_policy("model"))}
        async with serve_server(
            JudgeEnv, name="judge", options={"judge": "judge_model"}, peers=judge_peer
        ) as (env_url, _):
            peers = {
                "model": Target.single("model", policy_url, fast_policy("model")),
                "judge": Target.single("judge", env_url, fast_policy("resources")),
            }
            options = {"model": "model", "resources": "judge"}
            async with serve_server("tool_agent", name="agent", options=options, peers=peers) as (
                agent_url,
                _,
            ):
                yield agent_url


def _materialized(path: Path) -> Path:
    """The flat task rows of ``path`` as 0.7's materialized rows (run by the one agent)."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    path.write_bytes(b"".join(
        orjson.dumps({"task_id": {"taskset": "mcqa", "task_id": f"t{i}"}, "task_input": row})
        + b"\n" for i, row in enumerate(rows)
    ))  # fmt: skip
    return path


async def test_failures_jsonl_carries_0_7s_sidecar_fields_and_rollgyms_readers_read_it(
    tmp_path: Path,
) -> None:
    """A 0.7 row's line carries what 0.7's sidecar readers read, without a second copy of
    rollgym's error; a plain row's line carries rollgym's fields only."""
    tasks = _materialized(write_tasks(tmp_path / "tasks.jsonl", 4, fail={1, 3}))
    plain = write_tasks(tmp_path / "plain.jsonl", 2, fail={0, 1})
    out = tmp_path / "out"
    dialects = Dialects(ROW_DIALECTS)
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        cfg = stack_config({"concurrency": 2})
        prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False, dialects=dialects)
        async with asyncio.timeout(60):
            outcome = await Collector(prepared, stack.urls, progress=False).execute()
        rollouts, failures = assert_ledger_invariant(out)
        assert len(rollouts) == 2 and len(failures) == 2
        for line in failures:
            assert line["_ng_task_id"] == {"taskset": "mcqa", "task_id": f"t{line['task_index']}"}
            assert line["failure_kind"] == "agent_run_error" and line["delivery"] == "delivered"
            assert line[NG_TASK_INDEX] == line["task_index"]
            assert line["_ng_rollout_index"] == line["rollout_index"]
            assert line[NG_FAILURE_CLASS] == "agent_run_error"
            assert line[NG_FAILURE_TERMINAL] is False  # a model's 500: transient
            assert line["_ng_failure_stage"] == "agent"
            assert line["_ng_failure_type"] == "HTTPStatusError"
            assert line["_ng_failure_http_status"] == 502
            assert line["_ng_failure_message"].startswith("agent answered 502")
            assert len(line["_ng_failure_message"]) <= 200  # what 0.7's readers show
            assert "_ng_failure_response_body" not in line  # the error holds the body
            assert line["error"]["type"] == "http_status"  # rollgym's record, unchanged
        assert outcome.metrics["failures"]["by_kind"] == {"agent_run_error": 2}
        assert outcome.metrics["failures"]["by_server"] == {"model": 2}
        run = load_run(out)
        assert run.failures.by_server == {"model": 2}
        # --resume reads those lines and redoes the two rollouts, once the model is fixed.
        stack.model.options.fail_marker = None
        prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=True, dialects=dialects)
        async with asyncio.timeout(60):
            outcome = await Collector(prepared, stack.urls, progress=False).execute()
        assert outcome.status == "completed"
        rollouts, failures = assert_ledger_invariant(out)
        assert len(rollouts) == 4 and failures == []
        history = read_jsonl(out / "failures.history.jsonl")
        assert [h["failure_kind"] for h in history] == ["agent_run_error"] * 2
        # The same failure of a plain row: rollgym's fields only.
        stack.model.options.fail_marker = FAIL_MARKER
        prepared = prepare_run(cfg, cfg.collect, plain, tmp_path / "plain", resume=False)
        async with asyncio.timeout(60):
            outcome = await Collector(prepared, stack.urls, progress=False).execute()
    (line, _) = read_jsonl(tmp_path / "plain" / "failures.jsonl")
    assert set(line) == {
        "task_index", "rollout_index", NG_TASK_INDEX, "_ng_rollout_index", "attempts",
        "duration_s", "finished_at", "error", "rollgym_cost", "rollgym_fingerprint",
    }  # fmt: skip
    assert outcome.metrics["failures"]["by_kind"] == {}
    assert outcome.metrics["failures"]["by_server"] == {"model": 2}


def test_a_line_written_before_this_change_is_still_counted_by_its_kind(
    tmp_path: Path,
) -> None:
    """Lines of runs written before the 0.7 fields became its rows' only: their kind is
    counted; one with no kind is counted by type, server and root, not by kind."""
    error = ConnectError("refused", server="agent", endpoint="/run").to_dict()
    old = {
        "task_index": 0,
        "rollout_index": 0,
        "attempts": 1,
        "error": error,
        "failure_kind": "transport_unreachable",
        "_ng_failure_class": "agent_request_failed",
    }
    older = {"task_index": 1, "rollout_index": 0, "attempts": 1, "error": error}
    lines = b"".join(orjson.dumps(line) + b"\n" for line in (old, older))
    (tmp_path / "failures.jsonl").write_bytes(lines)
    metrics = compute_metrics(tmp_path, total=2, repeats=1)
    assert metrics.failures_by_kind == {"transport_unreachable": 1}
    assert metrics.failures_by_type == {"connect_error": 2}
    assert metrics.failures_by_root == {"connect_error": 2}


# -- 0.7's handled failures ---------------------------------------------------------------------

FAILURE = {
    "failure_reason": "Episode admission timed out",
    "terminal": True,
    "failure_kind": "agent_timeout",
    "stage": "admission",
    "partial_response": reply("Paris, I think"),  # a real Responses API response
}


def test_a_0_7_failure_is_a_typed_error_that_keeps_what_it_says() -> None:
    err = error_from_failure(FAILURE, server="mcqa_env", endpoint="/run")
    assert type(err) is EnvironmentFailure
    assert (err.message, err.server, err.endpoint) == (
        FAILURE["failure_reason"],
        "mcqa_env",
        "/run",
    )
    assert (err.terminal, err.stage, err.failure_kind) == (True, "admission", "agent_timeout")
    assert err.partial_response == FAILURE["partial_response"]
    assert err.retryable is False  # not terminal -> retryable
    assert error_from_failure({**FAILURE, "terminal": False}).retryable is True
    for back in (
        pickle.loads(pickle.dumps(err)),
        RollgymError.from_dict(orjson.loads(orjson.dumps(err.to_dict()))),
        err.with_fields(attempts=3),
    ):
        assert type(back) is EnvironmentFailure
        assert (back.terminal, back.stage, back.failure_kind) == (
            True,
            "admission",
            "agent_timeout",
        )
        assert back.partial_response == FAILURE["partial_response"]
    # Read back as 0.7 wrote it, and as a sidecar row writes an Environment Server's failure.
    assert episode_failure(err) == FAILURE
    assert failure_kind(err) == "agent_timeout" and delivery(err) == "delivered"
    assert sidecar_fields(err) == {
        "_ng_failure_class": "environment_server_failed",
        "_ng_failure_terminal": True,
        "_ng_failure_message": "Episode admission timed out",
        "_ng_failure_stage": "admission",
        "_ng_failure_partial_response": FAILURE["partial_response"],
    }


def test_a_0_7_failure_survives_the_ledger_and_its_readers(tmp_path: Path) -> None:
    err = error_from_failure(FAILURE, server="mcqa_env", endpoint="/run")
    ledger = Ledger(tmp_path, total=1, repeats=1)
    ledger.open()
    # A 0.7 row's record: the fields its dialect adds (``rows.ROWS``'s exchanges).
    fields = record_fields(err)
    assert ledger.add(FailedRollout(0, 0, err, attempts=1, duration_s=0.5, fields=fields))
    ledger.close()
    (line,) = read_jsonl(tmp_path / "failures.jsonl")
    assert line["failure_kind"] == "agent_timeout" and line["delivery"] == "delivered"
    assert line[NG_FAILURE_CLASS] == "environment_server_failed"
    assert line[NG_FAILURE_TERMINAL] is True and line["_ng_failure_stage"] == "admission"
    back = RollgymError.from_dict(line["error"])  # as --resume, reverify and report read it
    assert type(back) is EnvironmentFailure and back == err
    assert compute_metrics(tmp_path, total=1, repeats=1).failures_by_kind == {"agent_timeout": 1}
    # --resume reads it back (kept as final, or moved to the history to run again).
    Ledger(tmp_path, total=1, repeats=1).load(max_attempts=3)
    (kept,) = read_jsonl(tmp_path / "failures.jsonl") + read_jsonl(
        tmp_path / "failures.history.jsonl"
    )
    assert RollgymError.from_dict(kept["error"]) == err


def test_a_0_7_failure_reported_through_a_gateway_keeps_its_kind_and_terminal() -> None:
    env = error_from_failure(FAILURE, server="env")
    relayed = HTTPStatusError("502", status=502, server="agent", endpoint="/run", origin=env)
    back = RollgymError.from_dict(orjson.loads(orjson.dumps(relayed.to_dict())))
    assert (failure_kind(back), terminal(back), failure_stage(back)) == (
        "agent_timeout", True, "admission",
    )  # fmt: skip


def test_other_errors_keep_their_json_form() -> None:
    common = {"type", "message", "status", "body", "truncated", "url", "method", "server",
              "endpoint", "attempts", "retryable", "origin"}  # fmt: skip
    for cls in ALL_ERRORS:
        extra = {"terminal", "stage", "failure_kind", "partial_response"}
        want = common | extra if cls is EnvironmentFailure else common
        assert set(cls("x").to_dict()) == want, cls.__name__


def test_a_large_partial_response_is_dropped_and_flagged() -> None:
    big = {"output": ["x" * PARTIAL_LIMIT]}
    err = error_from_failure({**FAILURE, "partial_response": big})
    assert isinstance(err, EnvironmentFailure)
    assert err.partial_response is None and err.truncated is True
    changed = EnvironmentFailure("x").with_fields(partial_response=big)
    assert changed.partial_response is None and changed.truncated is True


def test_a_secret_in_a_partial_response_is_masked() -> None:
    err = error_from_failure({**FAILURE, "partial_response": {"text": "key sk-abcdefghijkl123"}})
    assert isinstance(err, EnvironmentFailure)
    assert err.partial_response == {"text": "key REDACTED"}


def test_names_0_7_does_not_register_are_kept_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="rollgym.nemo_gym"):
        for kind in ("usersim:scorer_inconclusive", "brand_new_kind", "brand_new_kind"):
            assert failure_kind(error_from_failure({**FAILURE, "failure_kind": kind})) == kind
    assert sum("brand_new_kind" in r.getMessage() for r in caplog.records) == 1
    assert not any("usersim" in r.getMessage() for r in caplog.records)  # namespaced: silent
    unset = error_from_failure({"failure_reason": "boom", "terminal": False, "stage": "seed"})
    assert failure_kind(unset) == "agent_run_error"


@pytest.mark.parametrize(
    "bad",
    [
        "not an object",
        {"terminal": True},
        {"failure_reason": "x"},
        {"failure_reason": "x", "terminal": "yes"},
        {"failure_reason": "x", "terminal": True, "stage": "lunch"},
        {"failure_reason": "x", "terminal": True, "failure_kind": 3},
    ],
)
def test_what_is_no_0_7_failure_is_a_protocol_error(bad: Any) -> None:
    err = error_from_failure(bad, server="env", endpoint="/run")
    assert type(err) is ProtocolError and err.server == "env" and err.body


def test_a_long_reason_is_cut_to_0_7s_limit() -> None:
    err = InternalError("x" * 1900, server="env", origin=InternalError("y" * 1900, server="m"))
    reason = episode_failure(err)["failure_reason"]
    assert len(reason) <= 2000 and reason.endswith("characters cut]")


# -- what 0.7's own models say of it ------------------------------------------------------------

_VALIDATE = """
import json, sys
from nemo_gym.rollout_outcomes import RolloutFailure
from nemo_gym.single_agent_turn_types import SingleAgentTurnFailure
for case in json.load(sys.stdin):
    failure = SingleAgentTurnFailure.model_validate(case["failure"])
    RolloutFailure.model_validate({
        "episode_id": {"rollout_id": "r1"}, "run_id": "run", "source": case["source"],
        "delivery": case["delivery"], "failure": failure.model_dump(exclude={"partial_response"}),
        "http_status": case["status"],
    })
print("ok")
"""


@pytest.mark.skipif(not NG07_PYTHON.exists(), reason="no NeMo Gym 0.7 interop venv here")
def test_0_7s_models_accept_what_rollgym_writes() -> None:
    cases = []
    for cls in ERROR_CLASSES:
        for how in ("alone", "model", "verify", "judge", "cleanup"):
            err = _where(cls("it failed", server="x"), how)
            source = "environment" if isinstance(err, EnvironmentFailure) else "collector"
            cases.append({
                "failure": episode_failure(err), "delivery": delivery(err), "source": source,
                "status": err.status if err.status and 100 <= err.status <= 599 else None,
            })  # fmt: skip
    cases.append({"failure": FAILURE, "delivery": "delivered", "source": "environment",
                  "status": None})  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [str(NG07_PYTHON), "-c", _VALIDATE], input=orjson.dumps(cases), capture_output=True,
        timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.strip() == b"ok"
