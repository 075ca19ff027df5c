"""SkyRL's training entrypoint with rollgym's generator (the README's SkyRL snippet).

ROLLGYM_AGENT_URL=http://10.0.0.5:8000 python skyrl_entrypoint.py <SkyRL's config overrides>
"""

import os
import sys

import ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.utils import validate_cfg
from skyrl.train.utils.utils import initialize_ray

from rollgym.integrations.skyrl import RollgymGenerator


class RollgymExp(BasePPOExp):
    def get_generator(self, cfg, tokenizer, inference_engine_client):
        # rollgym's agent server (or comma-separated replicas): its model server is an
        # openai_proxy (return_token_ids: true) in front of the engines SkyRL trains.
        return RollgymGenerator(
            os.environ["ROLLGYM_AGENT_URL"].split(","),
            pad_id=tokenizer.pad_token_id,
            concurrency=256,
            rollout_timeout=600,
        )


@ray.remote(num_cpus=1)
def skyrl_entrypoint(cfg):
    RollgymExp(cfg).run()


def main():
    cfg = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
