"""``from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper`` (NeMo RL's import)."""

from rollgym.integrations.nemo_rl import GlobalConfigDictParserConfig, RunHelper

__all__ = ["GlobalConfigDictParserConfig", "RunHelper"]
