"""``from nemo_gym.rollout_collection import RolloutCollectionHelper`` (NeMo RL's import)."""

from rollgym.integrations.nemo_rl import RolloutCollectionHelper

__all__ = ["RolloutCollectionHelper"]
