"""What an OpenEnv server answers, read strictly (``rollgym.openenv.session._answer`` and
``rollgym.openenv.translate``): a broken or hostile server's answer is a typed error naming it,
never a reward."""

from __future__ import annotations

import pickle
from typing import Any

import orjson
import pytest

from rollgym.errors import CapacityReached, HTTPStatusError, ProtocolError, RollgymError
from rollgym.openenv.session import Observation, Refused, _answer, ws_url

WHERE: dict[str, Any] = {"server": "env", "url": "ws://h/ws", "endpoint": "/step"}


def read(message: Any) -> Observation | Refused:
    return _answer(orjson.dumps(message).decode(), **WHERE)


def test_an_observation_is_read_with_its_reward_and_done() -> None:
    got = read(
        {"type": "observation", "data": {"observation": {"a": 1}, "reward": 2, "done": True}}
    )
    assert got == Observation({"a": 1}, 2.0, True)
    assert (
        read(
            {"type": "observation", "data": {"observation": {}, "reward": None, "done": False}}
        ).reward
        is None
    )


@pytest.mark.parametrize(
    "data",
    [
        '"observation": {}, "reward": "1.0", "done": true',  # a string is no reward
        '"observation": {}, "reward": true, "done": true',  # nor a bool
        '"observation": {}, "reward": NaN, "done": true',  # not JSON at all
        '"observation": {}, "reward": 1e309, "done": true',  # infinite once parsed
        '"observation": {}, "reward": 1.0, "done": "yes"',
        '"observation": {}, "reward": 1.0',  # done missing: never taken as false
        '"observation": [], "reward": 1.0, "done": false',
    ],
)
def test_a_malformed_observation_is_a_protocol_error(data: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        _answer('{"type": "observation", "data": {' + data + "}}", **WHERE)
    assert caught.value.server == "env"


def test_other_answers_are_typed_errors_of_the_server() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        _answer("<html>", **WHERE)
    with pytest.raises(ProtocolError, match="'state' message"):
        read({"type": "state", "data": {}})
    with pytest.raises(CapacityReached) as full:
        read({"type": "error", "data": {"code": "CAPACITY_REACHED", "message": "full",
                                        "active_sessions": 2, "max_sessions": 2}})  # fmt: skip
    assert (full.value.status, full.value.retryable) == (503, False)  # the policy decides
    assert "2 of 2 sessions" in full.value.message
    with pytest.raises(HTTPStatusError) as crashed:
        read({"type": "error", "data": {"code": "EXECUTION_ERROR", "message": "boom"}})
    assert crashed.value.status == 500 and type(crashed.value) is HTTPStatusError
    with pytest.raises(ProtocolError, match="UNKNOWN_TYPE"):
        read({"type": "error", "data": {"code": "UNKNOWN_TYPE", "message": "?"}})
    refused = read({"type": "error", "data": {"code": "VALIDATION_ERROR", "errors": [
        {"loc": ["message"], "msg": "Field required"}]}})  # fmt: skip
    assert refused == Refused("invalid action: message: Field required")


def test_capacity_reached_pickles_and_round_trips() -> None:
    err = CapacityReached("full", status=503, server="env", endpoint="/reset")
    assert pickle.loads(pickle.dumps(err)) == err
    assert RollgymError.from_dict(err.to_dict()) == err


def test_ws_url() -> None:
    assert ws_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/ws"
    assert ws_url("https://env.example") == "wss://env.example/ws"
