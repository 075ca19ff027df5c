"""``from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper`` (NeMo RL's import)."""

from rollgym.nemo_gym.rl import GlobalConfigDictParserConfig, RunHelper

__all__ = ["GlobalConfigDictParserConfig", "RunHelper"]
