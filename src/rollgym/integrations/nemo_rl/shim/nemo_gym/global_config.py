"""``nemo_gym.global_config``: where 0.7 keeps the parse options and the head server's key."""

from rollgym.integrations.nemo_rl import HEAD_SERVER_KEY_NAME, GlobalConfigDictParserConfig

__all__ = ["HEAD_SERVER_KEY_NAME", "GlobalConfigDictParserConfig"]
