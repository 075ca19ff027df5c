"""rollgym: collect RL rollouts from HTTP environments; every rollout ends as a record."""

__version__ = "0.1.0"
