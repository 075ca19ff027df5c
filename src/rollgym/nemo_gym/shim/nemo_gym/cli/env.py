"""``nemo_gym.cli.env.RunHelper``: where 0.7 keeps it."""

from rollgym.nemo_gym.rl import RunHelper

__all__ = ["RunHelper"]
