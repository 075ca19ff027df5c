"""``from nemo_gym.rollout_collection import RolloutCollectionHelper`` (NeMo RL's import)."""

from rollgym.nemo_gym.rl import RolloutCollectionHelper

__all__ = ["RolloutCollectionHelper"]
