"""``root_record`` walks an error record's ``origin`` chain as ``RollgymError.root`` walks the
error's: the JSON form in ``failures.jsonl`` and the error object name the same root."""

from __future__ import annotations

import pytest

from rollgym.errors import (
    ConnectError,
    DeadlineExceeded,
    HTTPStatusError,
    InternalError,
    ReadTimeout,
    RollgymError,
    WaitedTooLong,
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
