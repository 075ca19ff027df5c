"""Scorers that misbehave on demand, for ReasoningGymEnv's tests. Their own small module: a pool
worker imports it, and importing the test module there would cost seconds per worker."""

from __future__ import annotations

import os
import time
from typing import Any

from rollgym.envs.reasoning_gym.scoring import Scored, score_entry

HANG = "this answer makes the scorer hang"
DIE = "this answer kills the worker"


def misbehaving_score(
    dataset: str,
    config_json: str,
    plain: dict[str, Any],
    patches: list[Any],
    answer: str,
    carried: bool = True,
) -> Scored:
    """``score_entry``, except that ``HANG`` does not finish in time and ``DIE`` kills the
    worker process (as a scorer that runs out of memory would)."""
    if answer == HANG:
        time.sleep(60)
    if answer == DIE:
        os._exit(1)
    return score_entry(dataset, config_json, plain, patches, answer, carried)
