"""The stack SkyRL's tests run against, served on 127.0.0.1: the vLLM-shaped double behind
``openai_proxy`` (``return_token_ids``), rollgym's tool agent, and an echo environment whose
verify gives each rollout the reward its row names, masks or crashes the rollouts it names."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rollgym.http import Target
from rollgym.server.resources import Session
from rollgym.testing import serve_server
from rollgym.wire import MASK_SAMPLE
from tests.models.test_training_tokens import proxy_in_front
from tests.models.vllm_double import VllmDouble
from tests.support.servers import CountingEcho
from tests.support.stack import ECHO_TOOL, fast_policy


class ScoringEcho(CountingEcho):
    """Echo, but rollout ``r`` of a row with ``rewards`` gets ``rewards[r]``; a rollout in
    ``mask_rollouts`` is masked (``mask_sample``, placeholder reward 0.0); one in
    ``crash_rollouts`` makes verify raise (a 500: the rollout fails)."""

    async def verify(self, session: Session, task: dict[str, Any], response: dict[str, Any]) -> Any:
        reward = await super().verify(session, task, response)
        index = task["rollout_index"]
        if index in task.get("crash_rollouts", []):
            raise RuntimeError(f"verifier crashed on rollout {index}")
        if index in task.get("mask_rollouts", []):
            return {"reward": 0.0, MASK_SAMPLE: True}
        rewards = task.get("rewards")
        return {"reward": rewards[index] if rewards else reward, "turns_seen": 1}


def skyrl_row(word: str, **fields: Any) -> dict[str, Any]:
    """A task row the double answers by calling echo with ``word``, then saying it back."""
    params: dict[str, Any] = {"input": f"please echo {word}", "tools": [ECHO_TOOL]}
    params.update(fields.pop("params", {}))
    return {"responses_create_params": params, "expected_answer": word, **fields}


def skyrl_rows() -> list[dict[str, Any]]:
    """Four groups of three: varied rewards and a crashed verify; varied rewards and a masked
    rollout; a row whose every rollout fails (the proxy refuses ``previous_response_id``); and
    a plain row (reward 1.0 three times)."""
    return [
        skyrl_row("vA", rewards=[1.0, 0.0, 1.0], crash_rollouts=[2]),
        skyrl_row("vB", rewards=[1.0, 0.0, 0.5], mask_rollouts=[1]),
        skyrl_row("vC", params={"previous_response_id": "resp_1"}),
        skyrl_row("vD"),
    ]


@asynccontextmanager
async def skyrl_stack(upstream: VllmDouble) -> AsyncIterator[str]:
    """The agent's URL, with the double behind the proxy and ``ScoringEcho`` as its env."""
    async with (
        proxy_in_front(upstream) as model_url,
        serve_server(ScoringEcho, name="env") as (env_url, _),
    ):
        peers = {
            # Verify's 500 is tried once: the crash is the rollout's, deterministically.
            "model": Target.single("model", model_url, fast_policy("model")),
            "env": Target.single("env", env_url, fast_policy("resources", max_attempts=1)),
        }
        options = {"model": "model", "resources": "env"}
        async with serve_server("tool_agent", name="agent", options=options, peers=peers) as (
            agent_url,
            _,
        ):
            yield agent_url
