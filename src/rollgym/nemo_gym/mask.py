"""NeMo Gym 0.7's ``mask_sample``: a verify response whose reward is no measurement.

An environment sets ``mask_sample: true`` when its own infrastructure failed (a judge that could
not be asked, a checker that crashed) and the reward it answers is a placeholder. 0.7 leaves
such a sample out of every quality statistic; NeMo RL zeroes its loss, reading the flag from
``instance_config.mask_sample`` (which 0.7's ``judge_failsafe`` also writes "for older NeMo RL
consumers"). Both places are read here, and either one true masks. rollgym's core reads the
top only (``rollgym.protocol.mask_sample``, which refuses a nested flag the top does not say);
a 0.7 row's verify response is ``lifted`` before it reads it.

A value that is not a boolean is refused, not guessed: read as masked it would drop a real
measurement, read as not masked it would train on a reward the environment said is none.
"""

from __future__ import annotations

from typing import Any

import orjson

from rollgym.errors import ProtocolError
from rollgym.nemo_gym.wire import INSTANCE_CONFIG
from rollgym.wire import MASK_SAMPLE


def mask_values(verified: dict[str, Any]) -> list[Any]:
    """The ``mask_sample`` values a verify response gives (top-level, then NeMo RL's), those
    that are not null."""
    values = [verified.get(MASK_SAMPLE)]
    config = verified.get(INSTANCE_CONFIG)
    if isinstance(config, dict):
        values.append(config.get(MASK_SAMPLE))
    return [v for v in values if v is not None]


def is_masked(verified: dict[str, Any]) -> bool:
    """Whether a verify response (or its line in ``rollouts.jsonl``) asks to be masked: a
    ``mask_sample`` of true, at the top or in ``instance_config``."""
    return any(v is True for v in mask_values(verified))


def mask_sample(verified: dict[str, Any], *, server: str | None = None) -> bool | None:
    """What a verify response says of ``mask_sample``: True or False, None when it says
    nothing. ``ProtocolError`` (blaming ``server``) for a value that is not a boolean."""
    said = mask_values(verified)
    for value in said:
        if not isinstance(value, bool):
            raise ProtocolError(
                f"verify response has {MASK_SAMPLE} {_shown(value)}, which is no boolean "
                "(true: the reward is no measurement; false or absent: it is one)",
                server=server,
                body=orjson.dumps(verified)[:2000],
            )
    return any(said) if said else None


def lifted(verified: Any) -> Any:
    """``verified`` with a ``mask_sample: true`` said only in ``instance_config`` said at the
    top too, where rollgym reads it (anything else as it is: a value that is no boolean, or two
    that disagree, is refused by the core)."""
    if not isinstance(verified, dict) or verified.get(MASK_SAMPLE) is not None:
        return verified
    config = verified.get(INSTANCE_CONFIG)
    if isinstance(config, dict) and config.get(MASK_SAMPLE) is True:
        return {**verified, MASK_SAMPLE: True}
    return verified


def _shown(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()[:100]
    except TypeError:
        return type(value).__name__
