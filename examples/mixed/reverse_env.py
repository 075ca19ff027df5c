"""An OpenEnv environment for the mixed run, written with openenv-core 0.3.0's own classes and
served by its own ``create_app``: the model must answer the word it is given, reversed.

The task row picks the word (``openenv_reset: {"word": ...}``, passed to ``reset``); one step
answers it: reward 1.0 for the exact reversal, else 0.0, and the episode is done.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class ReverseAction(Action):
    message: str


class ReverseObservation(Observation):
    word: str = ""
    feedback: str = ""


class ReverseEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # one instance per session, nothing shared

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._word = ""

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, word: str = "", **kw: Any
    ) -> ReverseObservation:
        if not word:
            raise ValueError("reset needs a word")
        self._word = word
        self._state = State(episode_id=episode_id, step_count=0)
        return ReverseObservation(word=word, feedback="Answer with this word reversed.")

    def step(self, action: ReverseAction, timeout_s: float | None = None, **kw: Any) -> Any:
        self._state.step_count += 1
        right = action.message.strip() == self._word[::-1]
        return ReverseObservation(
            word=self._word, feedback="right" if right else "wrong",
            reward=1.0 if right else 0.0, done=True,
        )  # fmt: skip

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    ReverseEnvironment, ReverseAction, ReverseObservation, env_name="reverse",
    max_concurrent_envs=8,
)  # fmt: skip
