"""A verifier's reward files read exactly as Harbor reads them (``harbor`` 0.25,
``harbor.verifier.verifier.Verifier`` and ``harbor.cli.jobs._primary_reward``):

1. ``/logs/verifier/reward.json`` wins when it exists, else ``reward.txt``; neither is a failure.
2. An empty file is a failure.
3. ``reward.txt``: Python's ``float`` of its whole text (surrounding whitespace allowed), finite.
4. ``reward.json``: a JSON object whose every value is a number (``int``/``float``; JSON ``true``
   is an int to Python, and Harbor's pydantic model keeps it as 1), all finite. A JSON number
   alone, a list or a nested value is a failure (Harbor's ``VerifierResult`` takes a dict only).
5. The trial's reward is the ``reward`` key; else the only key's value; else (several keys and no
   ``reward``, or none at all) there is none: a failure.

Every failure is a ``VerifierError``: never a 0 and never a guess.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from rollgym.errors import VerifierError

REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"


@dataclass(frozen=True)
class Rewards:
    """What the verifier wrote: the trial's reward and every named value."""

    reward: float
    values: dict[str, float] = field(default_factory=dict)
    source: str = REWARD_TXT


def parse_rewards(reward_json: bytes | None, reward_txt: bytes | None) -> Rewards:
    """The reward from the files' bytes (None: the file does not exist)."""
    if reward_json is not None:
        values = _parse_json(reward_json)
        return Rewards(_primary(values, REWARD_JSON), values, REWARD_JSON)
    if reward_txt is not None:
        value = _parse_txt(reward_txt)
        return Rewards(value, {"reward": value}, REWARD_TXT)
    raise VerifierError(f"the verifier wrote no reward file ({REWARD_TXT} or {REWARD_JSON})")


def _parse_txt(data: bytes) -> float:
    if not data:
        raise VerifierError(f"{REWARD_TXT} is empty")
    try:
        value = float(data.decode("utf-8"))
    except (ValueError, TypeError):
        raise VerifierError(f"{REWARD_TXT} is no number: {_shown(data)}") from None
    if not math.isfinite(value):
        raise VerifierError(f"{REWARD_TXT} holds a non-finite reward: {value!r}")
    return value


def _parse_json(data: bytes) -> dict[str, float]:
    if not data:
        raise VerifierError(f"{REWARD_JSON} is empty")
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, TypeError):
        raise VerifierError(f"{REWARD_JSON} is not JSON: {_shown(data)}") from None
    values = parsed.values() if isinstance(parsed, dict) else [parsed]
    for value in values:
        if not isinstance(value, (int, float)):
            raise VerifierError(f"{REWARD_JSON} holds a non-numeric reward: {value!r:.200}")
        if isinstance(value, float) and not math.isfinite(value):
            raise VerifierError(f"{REWARD_JSON} holds a non-finite reward: {value!r}")
    if not isinstance(parsed, dict):
        raise VerifierError(f"{REWARD_JSON} is a bare value, not an object of named rewards")
    return {str(k): float(v) for k, v in parsed.items()}


def _primary(values: dict[str, float], source: str) -> float:
    if "reward" in values:
        return values["reward"]
    if len(values) == 1:
        return next(iter(values.values()))
    raise VerifierError(
        f"{source} names {len(values)} values and no 'reward': which one is the reward is "
        f"not said ({', '.join(sorted(values)[:8])})"
    )


def _shown(data: bytes) -> str:
    text = data[:120].decode("utf-8", "replace")
    return repr(text) + (f" ({len(data)} bytes)" if len(data) > 120 else "")
