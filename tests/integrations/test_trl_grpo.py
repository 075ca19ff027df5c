"""A real TRL ``GRPOTrainer`` trains for 3 steps on CPU on rollouts that a real rollgym stack
collects on 127.0.0.1: the tool agent, the echo environment, ``openai_proxy`` with
``return_token_ids`` in front of rollgym's CPU backend (``rollgym.models.local``) serving a tiny
model built here. Weights are pushed to the backend after every step.

What could fail and is checked: the steps ran; the trainer's weights changed, the backend
serves the last step's version and each step's rollouts ran on the previous step's weights; within one group a failed rollout and a verifier-masked one
become masked samples whose reward TRL sees as NaN and whose advantage is 0, and the group's
baseline is the mean of its scored rollouts only (a failure counted as 0 would move it); the
counts per step.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import orjson
import pytest

from rollgym.envs.echo.server import EchoEnv
from rollgym.errors import InvalidRequest
from rollgym.integrations.trl import RolloutFunc, TaskTable, WeightSyncCallback, rollgym_reward
from rollgym.integrations.weights import LocalModelWeights
from rollgym.models.tiny import build_tiny_model
from rollgym.server.resources import Session
from rollgym.testing import in_thread, rl_stack

pytestmark = pytest.mark.timeout(900)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL

G = 4
"""num_generations: rollouts per row and step."""


class FlakyEcho(EchoEnv):
    """The echo environment, except on rows with ``flaky``: its rollout 1 fails at verify (a
    4xx, not retried) and its rollout 2 is masked by the verifier (``mask_sample``)."""

    row_fields = frozenset({"expected_answer", "flaky"})

    async def verify(self, session: Session, task: dict[str, Any], response: dict[str, Any]) -> Any:
        reward = await super().verify(session, task, response)
        if task.get("flaky") and task.get("rollout_index") == 1:
            raise InvalidRequest("this verifier refuses rollout 1", status=422)
        if task.get("flaky") and task.get("rollout_index") == 2:
            return {"reward": 0.0, "mask_sample": True}
        return reward


def row(expected: str, **fields: Any) -> dict[str, Any]:
    # The same text for every row: only the stamp TaskTable puts in the prompt tells them apart.
    params = {"input": "Say something.", "max_output_tokens": 12, "temperature": 1.0}
    return {"responses_create_params": params, "expected_answer": expected, **fields}


def test_grpo_trainer_steps_on_rollouts_collected_by_rollgym(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    # A random model's 12 tokens contain "s" or "a" about half the time: rewards differ
    # within groups, so the policy gets a gradient.
    table = TaskTable([row("s"), row("a"), row("s", flaky=True)])
    args = GRPOConfig(
        output_dir=str(tmp_path / "trainer"),
        per_device_train_batch_size=len(table) * G,  # every row in every step
        num_generations=G,
        max_steps=3,
        learning_rate=1e-2,
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    with in_thread(rl_stack(model_dir, FlakyEcho)) as (agent_url, backend_url):
        weights = LocalModelWeights(backend_url)
        rollout_func = RolloutFunc(agent_url, table, rollout_timeout=300)
        sync = WeightSyncCallback(weights, tmp_path / "weights")
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[rollgym_reward],
            args=args,
            train_dataset=table.dataset(),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            rollout_func=rollout_func,
            callbacks=[sync],
        )
        trainer.train()
        served = orjson.loads(urlopen(f"{backend_url}/rollgym/weights", timeout=10).read())
        rollout_func.close()

    assert trainer.state.global_step == 3
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no weight moved in 3 steps"
    assert [version for version, _ in sync.versions] == [1, 2, 3]
    assert served["rollgym_policy_version"] == 3 and weights.version == 3

    # Every step: the flaky row's rollout 1 failed and rollout 2 was masked; the rest scored.
    assert len(rollout_func.reports) == 3
    for step, report in enumerate(rollout_func.reports):
        # Step n's rollouts came from the weights pushed after step n - 1 (0: the start).
        assert report.policy_versions == (step,)
        assert (report.rollouts, report.scored, report.masked) == (3 * G, 3 * G - 2, 2)
        assert (report.failed, report.verifier_masked) == (1, 1)
        assert report.failure_types == {"HTTPStatusError": 1}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    masked_logged = [
        h["rollgym/masked"] for h in trainer.state.log_history if "rollgym/masked" in h
    ]
    assert masked_logged == [2.0, 2.0, 2.0]

    # What TRL made of the last step (its private logs, read here only to check the contract):
    # each group of G in generation order; the flaky row's masked samples are NaN with
    # advantage 0 and its baseline is the mean of its two scored rollouts.
    logs: Any = trainer._logs
    rewards = torch.tensor(list(logs["rewards"]["rollgym_reward"])).view(-1, G)
    advantages = torch.tensor(list(logs["advantages"])).view(-1, G)
    flaky = [g for g in range(len(table)) if rewards[g].isnan().sum() == 2]
    assert len(flaky) == 1, rewards
    g = flaky[0]
    assert rewards[g].isnan().tolist() == [False, True, True, False]
    assert advantages[g, 1].item() == 0.0 and advantages[g, 2].item() == 0.0
    scored = rewards[g, [0, 3]]
    expected = (scored - scored.mean()) / (scored.std() + 1e-4)  # std of 2 values, unbiased
    assert torch.allclose(advantages[g, [0, 3]], expected, atol=1e-4), (rewards[g], advantages[g])


QUICKSTART = Path(__file__).parents[2] / "examples" / "trl_quickstart.py"


def test_the_readme_quickstart_trains_against_a_running_stack(tmp_path: Path) -> None:
    """``examples/trl_quickstart.py`` (the README's TRL snippet, verbatim) as a user runs it:
    its own process, the stack's URLs and a task file; one step."""
    model_dir = build_tiny_model(tmp_path / "tiny", seed=1)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [row("s"), row("a", flaky=True)]))
    out = tmp_path / "out"
    with in_thread(rl_stack(model_dir, FlakyEcho)) as (agent_url, backend_url):
        argv = [agent_url, backend_url, str(model_dir), str(tasks), str(out), "1"]
        done = subprocess.run(
            [sys.executable, str(QUICKSTART), *argv],
            capture_output=True,
            text=True,
            timeout=800,
            env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"},
        )
        served = orjson.loads(urlopen(f"{backend_url}/rollgym/weights", timeout=10).read())
    assert done.returncode == 0, done.stderr[-4000:]
    assert "steps: 1 masked per step: [2]" in done.stdout, done.stdout
    assert served["rollgym_policy_version"] == 1
