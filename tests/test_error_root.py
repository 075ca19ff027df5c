"""``root_record`` walks an error record's ``origin`` chain as ``RollgymError.root`` walks the
error's: the JSON form in ``failures.jsonl`` and the error object name the same root.
``root_cause`` names the cause a failure is counted by, the same on both forms."""

from __future__ import annotations

import pytest

from rollgym.errors import (
    ALL_ERRORS,
    CAUSE_TYPES,
    CONTEXT_TYPES,
    ENDING_TYPES,
    BudgetExhausted,
    CircuitOpen,
    ConnectError,
    DeadlineExceeded,
    HTTPStatusError,
    InternalError,
    ReadTimeout,
    ReplicaDown,
    RollgymError,
    RootCause,
    WaitedTooLong,
    root_cause,
    root_record,
)


def _chains() -> list[RollgymError]:
    model_bug = InternalError("NaN in logprobs", server="model", endpoint="/v1/responses")
    model_500 = HTTPStatusError("500", status=500, server="model", origin=model_bug)
    agent_502 = HTTPStatusError("502", status=502, server="agent", origin=model_500)
    last_read = ReadTimeout("no answer", server="model")
    return [
        model_bug,
        model_500,  # a status answer: into the error its server reported, same server or not
        agent_502,  # a gateway's 502 -> the model's 500 -> the model's own error
        DeadlineExceeded("ran out", server="model", origin=last_read),  # same server: stays
        WaitedTooLong("no worker", server="model", origin=last_read),
        RollgymError("rollout failed", server="agent", origin=agent_502),
        ConnectError("refused", server="agent", origin=ConnectError("refused", server=None)),
    ]


@pytest.mark.parametrize("err", _chains(), ids=lambda e: f"{type(e).__name__}:{e.server}")
def test_the_record_root_is_the_error_root(err: RollgymError) -> None:
    assert root_record(err.to_dict()) == err.root().to_dict()


def test_an_unknown_type_is_walked_as_a_plain_error_and_keeps_its_type() -> None:
    record = {
        "type": "from_a_newer_rollgym",
        "server": "agent",
        "origin": {"type": "http_status", "server": "agent", "origin": {"type": "x"}},
    }
    assert root_record(record) is record  # same server, not a status answer: the root
    record["server"] = "gateway"
    assert root_record(record)["type"] == "x"  # another server's, then into its status answer


def test_a_record_without_origin_is_its_own_root() -> None:
    assert root_record({}) == {}
    assert root_record({"type": "http_status", "origin": "not a record"})["type"] == "http_status"


# -- root_cause: the deepest cause, with the deadline, budget or breaker that ended it -------


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_type_is_classified_as_a_cause_or_as_context(cls: type[RollgymError]) -> None:
    """A new error type must be put in one of the two sets (``root_cause``'s docstring)."""
    assert (cls.type in CAUSE_TYPES) != (cls.type in CONTEXT_TYPES), cls.type
    assert ENDING_TYPES <= CONTEXT_TYPES
    alone = cls("x", server="model")
    assert root_cause(alone) == RootCause(cls.type, None)  # no origin: its own cause
    behind = cls("x", server="model", origin=ReadTimeout("slow", server="model.upstream"))
    if cls.type in CONTEXT_TYPES:
        ended = cls.type if cls.type in ENDING_TYPES else None
        assert root_cause(behind) == RootCause("read_timeout", ended)
    else:
        assert root_cause(behind) == RootCause("read_timeout", None)  # the deepest cause
        above_context = cls("x", origin=CircuitOpen("open", server="model"))
        assert root_cause(above_context) == RootCause(cls.type, None)
    for err in (alone, behind):
        assert root_cause(err.to_dict()) == root_cause(err)  # the record reads the same


def test_the_cause_sets_are_the_tree() -> None:
    assert {c.type for c in ALL_ERRORS} == CAUSE_TYPES | CONTEXT_TYPES
    assert not CAUSE_TYPES & CONTEXT_TYPES


def test_a_frozen_replica_behind_gateways_budgets_and_breakers() -> None:
    down = ReplicaDown("failed its liveness probe", server="model.upstream")
    model_504 = HTTPStatusError("model answered 504", status=504, server="model", origin=down)
    agent_502 = HTTPStatusError("agent answered 502", status=502, server="agent", origin=model_504)
    assert root_cause(agent_502) == RootCause("replica_down", None)
    refused = CircuitOpen("circuit open", server="model.upstream", origin=down)
    through = HTTPStatusError("502", status=502, server="agent", origin=refused)
    assert root_cause(through) == RootCause("replica_down", "circuit_open")
    spent = BudgetExhausted("spent", server="model.upstream", origin=ConnectError("refused"))
    timed_out = DeadlineExceeded("ran out", server="model", origin=spent)
    assert root_cause(timed_out) == RootCause("connect_error", "deadline_exceeded")  # outermost
    # A breaker whose cause is unknown, a deadline with nothing behind it: their own causes.
    assert root_cause(CircuitOpen("open", server="m")) == RootCause("circuit_open", None)
    assert root_cause(DeadlineExceeded("late")) == RootCause("deadline_exceeded", None)
    assert root_cause(HTTPStatusError("500", status=500)) == RootCause("http_status", None)


def test_a_record_of_an_unknown_type_is_a_cause_and_keeps_its_name() -> None:
    record = {"type": "http_status", "origin": {"type": "from_a_newer_rollgym", "origin": None}}
    assert root_cause(record) == RootCause("from_a_newer_rollgym", None)
    assert root_cause({}) == RootCause("unknown", None)
    assert root_cause({"type": "budget_exhausted", "origin": "junk"}).type == "budget_exhausted"
