"""TRL's GRPOTrainer on rollouts rollgym collects: the wiring, nothing else.

    python examples/trl_quickstart.py AGENT_URL MODEL_SERVER_URL MODEL_DIR TASKS.jsonl OUT STEPS

AGENT_URL: a rollgym agent whose model is openai_proxy (return_token_ids: true) in front of
the policy server at MODEL_SERVER_URL (rollgym's CPU backend here; VllmWeights for vLLM).
"""

import sys

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rollgym.collect.tasks import iter_tasks
from rollgym.integrations.trl import RolloutFunc, TaskTable, WeightSyncCallback, rollgym_reward
from rollgym.integrations.weights import LocalModelWeights

agent_url, model_url, model_dir, tasks, out, steps = sys.argv[1:7]
table = TaskTable(list(iter_tasks(tasks)))  # the prompts TRL gets name their rows exactly
rollout_func = RolloutFunc(agent_url, table, sampling={"temperature": 1.0})
trainer = GRPOTrainer(
    model=AutoModelForCausalLM.from_pretrained(model_dir),
    processing_class=AutoTokenizer.from_pretrained(model_dir),
    args=GRPOConfig(
        output_dir=out,
        use_vllm=False,  # TRL never generates: rollout_func brings the rollouts
        num_generations=4,
        per_device_train_batch_size=4 * len(table),
        temperature=1.0,  # the same as the rollouts': TRL scores tokens at its own
        max_steps=int(steps),
        report_to=[],
        use_cpu=True,
    ),
    train_dataset=table.dataset(),
    rollout_func=rollout_func,
    reward_funcs=[rollgym_reward],  # None for failed or masked rollouts: out of the baseline
    callbacks=[WeightSyncCallback(LocalModelWeights(model_url), f"{out}/weights")],
)
trainer.train()
masked = [report.masked for report in rollout_func.reports]
print("steps:", trainer.state.global_step, "masked per step:", masked)
