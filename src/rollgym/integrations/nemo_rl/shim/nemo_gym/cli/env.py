"""``nemo_gym.cli.env.RunHelper``: where 0.7 keeps it."""

from rollgym.integrations.nemo_rl import RunHelper

__all__ = ["RunHelper"]
