"""Reward files read as Harbor 0.25 reads them (``harbor.verifier.verifier``): every case is
one Harbor decides, and every failure is a ``VerifierError``, never a 0."""

from __future__ import annotations

import pytest

from rollgym.errors import VerifierError
from rollgym.harbor.reward import REWARD_JSON, REWARD_TXT, parse_rewards


@pytest.mark.parametrize(
    ("text", "reward"),
    [(b"1", 1.0), (b"0\n", 0.0), (b"  0.25 \n", 0.25), (b"1e0", 1.0), (b"-0.5", -0.5),
     (b"1_0", 10.0), (b"+.5", 0.5)],
)  # fmt: skip
def test_reward_txt_is_pythons_float(text: bytes, reward: float) -> None:
    got = parse_rewards(None, text)
    assert got.reward == reward and got.source == REWARD_TXT


@pytest.mark.parametrize(
    "text", [b"", b" ", b"one", b"1.0 passed", b"nan", b"inf", b"-Infinity", b"\xff", b"1,0"]
)
def test_unreadable_reward_txt_is_a_failure(text: bytes) -> None:
    with pytest.raises(VerifierError):
        parse_rewards(None, text)


def test_reward_json_wins_over_reward_txt() -> None:
    got = parse_rewards(b'{"reward": 0.4, "lines": 2}', b"1")
    assert got.reward == 0.4 and got.values == {"reward": 0.4, "lines": 2.0}
    assert got.source == REWARD_JSON


def test_reward_json_single_key_is_the_reward() -> None:
    assert parse_rewards(b'{"score": 0.75}', None).reward == 0.75


def test_reward_json_true_is_one_as_in_harbor() -> None:
    # bool is an int to Python; Harbor's pydantic model keeps it as 1.
    assert parse_rewards(b'{"reward": true}', None).reward == 1.0


@pytest.mark.parametrize(
    "text",
    [b"", b"1", b"[1]", b'"1"', b'{"reward": "1"}', b'{"reward": null}', b'{"reward": [1]}',
     b'{"reward": NaN}', b'{"reward": 1e309}', b'{"a": 1, "b": 0}', b"{}", b"{bad json"],
)  # fmt: skip
def test_unreadable_reward_json_is_a_failure(text: bytes) -> None:
    with pytest.raises(VerifierError):
        parse_rewards(text, b"1")  # a reward.txt beside it does not rescue it, as in Harbor


def test_no_reward_file_is_a_failure_not_zero() -> None:
    with pytest.raises(VerifierError, match="no reward file"):
        parse_rewards(None, None)
