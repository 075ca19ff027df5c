"""Start a config's servers as real processes, wait for health, stop them cleanly."""

from rollgym.launch.supervisor import Supervisor

__all__ = ["Supervisor"]
