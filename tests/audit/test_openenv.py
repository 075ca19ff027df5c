"""``rollgym audit`` plays OpenEnv environments through their ``/ws`` session (before, such a
server refused every HTTP play and read ``unaudited``): openenv-core's own servers on real
sockets, the echo environment the OpenEnv tests use, a word-reversal environment as
``examples/mixed`` has it, and two flawed variants of it."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest

from rollgym.audit.play import ServerAudit, audit_server
from rollgym.audit.target import Environment
from rollgym.dialects import AUDIT_DIALECTS
from rollgym.http import HttpClient
from rollgym.testing import serve_asgi

pytest.importorskip("openenv.core", reason="needs openenv-core (the dev extra)")

from tests.openenv.conftest import echo_env_root  # noqa: F401 (a fixture, used by name)

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 5.0
WORDS = ["gradient", "rollout", "verifier", "sampler"]
ROWS = [
    {"openenv_reset": {"word": w},
     "responses_create_params": {"input": "Reverse the word you are given."}}
    for w in WORDS
]  # fmt: skip


def reverse_app(pays: str = "") -> Any:
    """The word-reversal environment (``examples/mixed/reverse_env.py``'s); ``pays`` plants a
    flaw: ``empty`` pays an empty answer too, ``word`` pays the word given back."""
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment
    from openenv.core.env_server.types import Action, Observation, State

    class ReverseAction(Action):  # type: ignore[misc]
        message: str

    class ReverseObservation(Observation):  # type: ignore[misc]
        word: str = ""

    class Reverse(OpenEnvEnvironment):  # type: ignore[misc]
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id=None, step_count=0)
            self._word = ""

        def reset(self, seed: Any = None, episode_id: Any = None, word: str = "", **kw: Any) -> Any:
            self._word = word
            return ReverseObservation(word=word)

        def step(self, action: Any, timeout_s: Any = None, **kw: Any) -> Any:
            text = action.message.strip()
            right = text == self._word[::-1]
            if pays == "empty" and not text:
                right = True
            if pays == "word" and self._word in text:
                right = True
            return ReverseObservation(word=self._word, reward=float(right), done=True)

        @property
        def state(self) -> State:
            return self._state

    return create_app(
        Reverse, ReverseAction, ReverseObservation, env_name="reverse", max_concurrent_envs=2
    )


async def audit(app: Any, rows: list[dict[str, Any]]) -> ServerAudit:
    async with serve_asgi(app) as url, HttpClient() as http, AsyncExitStack() as stack:
        for dialect in AUDIT_DIALECTS:
            env = await stack.enter_async_context(dialect("env", url, TIMEOUT, 8))
            if env is not None:
                return await audit_server(env, rows)
        return await audit_server(Environment(http, "env", url, timeout=TIMEOUT), rows)


async def test_the_reversal_environment_is_audited_clean_over_its_session() -> None:
    result = await audit(reverse_app(), ROWS)
    assert result.verdict == "clean", result.to_dict()
    # Scored, not refused: the panel was played (its server holds two sessions, the audit
    # asks for eight at once: a full server is waited for, never a finding).
    assert result.refused == 0 and result.skipped == 0
    assert result.plays > 100


@pytest.mark.parametrize(("pays", "cls"), [("empty", "empty_answer"), ("word", "prompt_echo")])
async def test_a_flawed_reversal_environment_is_found(pays: str, cls: str) -> None:
    # "word": the word is in the reset's observation only, not in the row: the audit reads
    # it from there, as the agent shows it to the model.
    result = await audit(reverse_app(pays), ROWS)
    assert result.verdict == "exploitable", result.to_dict()
    assert cls in {f.cls for f in result.findings}, result.to_dict()


@pytest.mark.usefixtures("echo_env_root")
async def test_the_echo_environment_pays_an_answer_by_its_length() -> None:
    from tests.openenv.support import echo_app

    rows = [{"responses_create_params": {"input": "Send the echo environment a greeting."}}] * 4
    result = await audit(echo_app(max_concurrent_envs=1), rows)
    # Its reward is the message's length times 0.1: a long program (or 1 MB of nines) earns
    # more than a plainly wrong answer. A fact of the demo environment, which has no task.
    assert result.verdict == "exploitable", result.to_dict()
    found = {f.cls: f for f in result.findings}
    assert {"always_equal", "early_exit"} <= set(found), sorted(found)
    assert all(f.mean_reward > f.mean_floor for f in found.values())  # type: ignore[operator]
