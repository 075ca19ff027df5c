"""Run in a Python with SkyRL (``SKYRL_PYTHON``) by ``test_skyrl.py``: SkyRL's own path from a
dataset file to the advantages, with ``RollgymGenerator`` as the generator.

    python skyrl_generate_check.py AGENT_URL ROWS.json OUT.json

ROWS.json holds rollgym task rows. They become a SkyRL dataset (``dataset_row``, a JSONL file)
read by SkyRL's ``PromptDataset`` (with a tiny tokenizer built here) and its ``collate_fn``;
SkyRL's ``prepare_generator_input`` expands them (3 samples per prompt, SkyRL's default vLLM
sampling parameters); the batch is shuffled (the generator must answer in input order, whatever
it is); ``generate`` runs against rollgym's agent at AGENT_URL; SkyRL's
``validate_generator_output`` checks the output; SkyRL's trainer steps turn it into per-token
rewards and batch tensors (``convert_prompts_responses_to_batch_tensors``) and GRPO advantages
(``compute_grpo_outcome_advantage``). OUT.json gets what the test checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_vllm_sampling_params
from skyrl.backends.skyrl_train.utils.ppo_utils import compute_grpo_outcome_advantage
from skyrl.train.config import SamplingParams
from skyrl.train.dataset.dataset import PromptDataset
from skyrl.train.dataset.preprocess import convert_prompts_responses_to_batch_tensors
from skyrl.train.generators.base import (
    GeneratorInput,
    GeneratorInterface,
    GeneratorOutput,
    TrajectoryID,
)
from skyrl.train.generators.utils import prepare_generator_input
from skyrl.train.utils.trainer_utils import validate_generator_output
from skyrl_entrypoint import RollgymExp
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rollgym.integrations.skyrl import RollgymGenerator, dataset_row

SAMPLES = 3
PAD = 0


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with a chat template: all SkyRL's dataset asks of one (and the
    entrypoint: its pad id)."""
    vocab = {"[PAD]": PAD, "[UNK]": 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    template = "{% for m in messages %}<{{ m.role }}> {{ m.content }} {% endfor %}<assistant>"
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", chat_template=template
    )


def shuffled(batch: GeneratorInput, order: list[int]) -> GeneratorInput:
    out: dict[str, Any] = dict(batch)
    for key in ("prompts", "env_classes", "env_extras", "trajectory_ids"):
        out[key] = [batch[key][i] for i in order]  # type: ignore[literal-required]
    return out  # type: ignore[return-value]


async def generate(agent_url: str, batch: GeneratorInput) -> GeneratorOutput:
    # The README's entrypoint builds the generator (its experiment without BasePPOExp's
    # __init__, which loads a model and places GPUs; get_generator reads none of that).
    os.environ["ROLLGYM_AGENT_URL"] = agent_url
    exp = RollgymExp.__new__(RollgymExp)
    generator = exp.get_generator(None, tiny_tokenizer(), None)
    assert isinstance(generator, GeneratorInterface)
    assert isinstance(generator, RollgymGenerator)
    try:
        output: GeneratorOutput = await generator.generate(batch)
    finally:
        await generator.aclose()
    return output


def main(agent_url: str, rows_path: Path, out_path: Path) -> None:
    rows = json.loads(rows_path.read_text())
    data = out_path.parent / "skyrl_dataset.jsonl"
    data.write_text("".join(json.dumps(dataset_row(row, i)) + "\n" for i, row in enumerate(rows)))
    dataset = PromptDataset([str(data)], tiny_tokenizer(), max_prompt_length=512, num_workers=1)
    prompts = dataset.collate_fn([dataset[i] for i in range(len(dataset))])
    sampling = get_vllm_sampling_params(SamplingParams(max_generate_length=64, temperature=0.7))
    batch, uids = prepare_generator_input(prompts, SAMPLES, sampling, "rollgym", "train", 1)
    order = list(range(len(uids)))
    random.Random(7).shuffle(order)
    batch = shuffled(batch, order)

    output = asyncio.run(generate(agent_url, batch))  # SkyRL's trainer awaits it in its loop
    rollout_metrics = output.pop("rollout_metrics")  # as SkyRL's trainer.generate does
    validate_generator_output(len(batch["prompts"]), output)

    # The trainer's steps (trainer.postprocess_generator_output, convert_to_training_input,
    # compute_advantages_and_returns), in the shuffled order.
    per_token = []
    for reward, response in zip(output["rewards"], output["response_ids"], strict=True):
        tokens = [0.0] * len(response)
        tokens[-1] = float(reward)
        per_token.append(tokens)
    _, _, response_mask, rewards, loss_mask, logprobs, _, _ = (
        convert_prompts_responses_to_batch_tensors(
            PAD,
            output["prompt_token_ids"],
            output["response_ids"],
            per_token,
            output["loss_masks"],
            output["rollout_logprobs"],
        )
    )
    uid_order = [batch["trajectory_ids"][i].instance_id for i in range(len(order))]
    advantages, _ = compute_grpo_outcome_advantage(rewards, response_mask, np.array(uid_order))
    ids = output["trajectory_ids"]
    out = {
        "input": [[t.instance_id, t.repetition_id] for t in batch["trajectory_ids"]],
        "sampling": sampling,
        "trajectory_ids": None if ids is None else [[t.instance_id, t.repetition_id] for t in ids],
        "trajectory_ids_type": None if ids is None else sorted({type(t).__name__ for t in ids}),
        "prompt_token_ids": output["prompt_token_ids"],
        "response_ids": output["response_ids"],
        "loss_masks": output["loss_masks"],
        "rollout_logprobs": output["rollout_logprobs"],
        "rewards": output["rewards"],
        "stop_reasons": output["stop_reasons"],
        "env_metrics": output["env_metrics"],
        "rollout_metrics": rollout_metrics,
        # GRPO's advantage is one number per row, on each of its response tokens.
        "advantage": [
            float(a[m.bool()][0]) for a, m in zip(advantages, response_mask, strict=True)
        ],
        "trained_tokens": [int(m.sum()) for m in loss_mask],
        "logprobs_shape": list(logprobs.shape) if logprobs is not None else None,
        "loss_mask_shape": list(loss_mask.shape),
        "trajectory_id_class": TrajectoryID.__module__,
    }
    out_path.write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
