"""Runs in a Python that has verl (``VERL_PYTHON``): verl's own ``AgentLoopWorker`` drives the
``rollgym`` agent loop against a rollgym stack, and the batch goes on through verl's own union
and advantage computation, as ``RayPPOTrainer.fit`` does.

    python verl_agent_loop_check.py WORKDIR TASKS DRIFT_TASKS DRIFT_AGENT_URL   (ROLLGYM_AGENT_URL set)

Builds a tiny tokenizer and model config on the spot (no download), composes verl's default
``ppo_trainer`` config with ``agent_loop_config_path`` = ``verl_agent_loop.yaml`` beside this
file, writes the task rows (JSON lines) as verl parquet rows with ``verl_make_rows.py``, reads
them back with verl's ``RLHFDataset``, and prints one JSON object: each output row unpadded,
the reward extra keys, and the advantages of ``rollgym_grpo`` and of verl's ``grpo``. No GPU, no inference server:
the agent loop's model is rollgym's, so verl's ``llm_client`` is None. Its reward loop is a
stand-in that fails if verl asks it for a score (the loop's score must be used as it is).
"""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
N = 2  # rollouts per row (verl's rollout.n)


def tiny_model(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["please echo v7", "the answer is"] * 10, trainer)
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>",
        chat_template=template,
    ).save_pretrained(out)  # fmt: skip
    LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, architectures=["LlamaForCausalLM"],
    ).save_pretrained(out)  # fmt: skip


def verl_config(model: Path) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(
        str(Path(verl.__file__).parent / "trainer/config"), version_base=None
    ):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.rollout.name=vllm",  # its config only: no vLLM is started
                "actor_rollout_ref.rollout.prompt_length=64",
                "actor_rollout_ref.rollout.response_length=256",
                f"actor_rollout_ref.rollout.n={N}",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={HERE / 'verl_agent_loop.yaml'}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=rollgym",
                "data.max_prompt_length=64",
                "algorithm.adv_estimator=rollgym_grpo",
            ],
        )


class RefusingRewardLoop:
    """verl's reward-loop worker handle, asked for a score only when an output has none."""

    class _Method:
        def remote(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("verl asked its reward loop to score a rollgym rollout")

    compute_score = _Method()


def read_rows(work: Path, tasks: Path, tokenizer: Any, config: Any) -> Any:
    """``tasks`` (JSON lines) through ``verl_make_rows.py`` and verl's ``RLHFDataset``."""
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = work / f"{tasks.stem}.parquet"
    # As ``python verl_make_rows.py TASKS PATH`` would, without a second import of verl.
    argv, sys.argv = sys.argv, ["verl_make_rows.py", str(tasks), str(path)]
    try:
        runpy.run_path(str(HERE / "verl_make_rows.py"), run_name="__main__")
    finally:
        sys.argv = argv
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=config.data)
    return DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))


async def generate(worker: Any, batch: Any) -> Any:
    """``RayPPOTrainer.fit``'s steps around the agent loops: uid, the generation batch, ``n``
    repeats, the agent loops, the union with the repeated batch."""
    import numpy as np

    batch.non_tensor_batch["uid"] = np.array(
        [str(uuid.uuid4()) for _ in range(len(batch))], dtype=object
    )
    keep = {"data_source", "reward_model", "extra_info", "uid"} & batch.non_tensor_batch.keys()
    gen = batch.pop(batch_keys=[], non_tensor_batch_keys=list(set(batch.non_tensor_batch) - keep))
    gen.non_tensor_batch.update(batch.non_tensor_batch)
    out = await worker.generate_sequences(gen.repeat(repeat_times=N, interleave=True))
    return batch.repeat(repeat_times=N, interleave=True).union(out)


def unpadded(batch: Any) -> list[dict[str, Any]]:
    rows = []
    width = batch.batch["prompts"].shape[1]
    for i in range(len(batch)):
        attention = batch.batch["attention_mask"][i]
        prompt = batch.batch["prompts"][i][attention[:width].bool()].tolist()
        size = int(attention[width:].sum())
        rows.append(
            {
                "prompt_ids": prompt,
                "response_ids": batch.batch["responses"][i][:size].tolist(),
                "response_mask": batch.batch["response_mask"][i][:size].tolist(),
                "logprobs": [
                    round(x, 6) for x in batch.batch["rollout_log_probs"][i][:size].tolist()
                ],
                "padded_mask_sum": int(batch.batch["response_mask"][i].sum()),
                "rm_score": float(batch.batch["rm_scores"][i].sum()),
                "rm_score_at": int(batch.batch["rm_scores"][i].nonzero().flatten().tolist()[-1])
                if batch.batch["rm_scores"][i].any()
                else None,
                "masked": bool(batch.non_tensor_batch["rollgym_masked"][i]),
                "reason": batch.non_tensor_batch["rollgym_reason"][i],
                "error_type": (batch.non_tensor_batch["rollgym_error"][i] or {}).get("type"),
                "reward": batch.non_tensor_batch["rollgym_reward"][i],
                "num_turns": int(batch.non_tensor_batch["__num_turns__"][i]),
            }
        )
    return rows


def advantages(batch: Any, estimator: str, config: Any, uids: list[str]) -> list[float]:
    import numpy as np
    from verl.trainer.ppo.ray_trainer import compute_advantage

    data = batch.select(deepcopy=True)
    data.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data = compute_advantage(data, estimator, config=config.algorithm)
    # An outcome advantage is one value per row, on its trained tokens (0 where the mask is 0).
    return [
        round(float(a[m.bool()][0]), 4) if m.any() else 0.0
        for a, m in zip(data.batch["advantages"], data.batch["response_mask"], strict=True)
    ]


async def main() -> None:
    work, tasks, drift_tasks, drift_url = (
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        Path(sys.argv[3]),
        sys.argv[4],
    )
    tiny_model(work / "model")
    config = verl_config(work / "model")

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    import rollgym.integrations.verl  # noqa: F401  registers rollgym_grpo (VERL_USE_EXTERNAL_MODULES does it in verl's processes)

    worker = AgentLoopWorker(
        config, llm_client=None, reward_loop_worker_handles=[RefusingRewardLoop()]
    )
    batch = await generate(worker, read_rows(work, tasks, worker.tokenizer, config))
    rows = unpadded(batch)
    uids = list(batch.non_tensor_batch["uid"])
    one_group = [uids[0]] * len(uids)  # every row in one group: scored and masked together
    result = {
        "rows": rows,
        "shapes": {k: list(batch.batch[k].shape) for k in ("prompts", "responses", "response_mask", "input_ids")},
        "reward_extra_keys": batch.meta_info.get("reward_extra_keys"),
        "rollgym_counts": {k: batch.non_tensor_batch[k].tolist() for k in batch.meta_info.get("reward_extra_keys", [])},
        "rollgym_grpo": advantages(batch, "rollgym_grpo", config, one_group),
        "grpo": advantages(batch, "grpo", config, one_group),
        "rollgym_grpo_by_row": advantages(batch, "rollgym_grpo", config, uids),
    }  # fmt: skip

    os.environ["ROLLGYM_AGENT_URL"] = drift_url  # the agent-loop config reads it per rollout
    drifted = await generate(worker, read_rows(work, drift_tasks, worker.tokenizer, config))
    result["drift"] = unpadded(drifted)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
