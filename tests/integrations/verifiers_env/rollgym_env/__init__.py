"""An Environments Hub package for verifiers 0.4 / prime-rl: rollgym's environments as a taskset."""

from rollgym.integrations.verifiers_taskset import RollgymHarness, RollgymTaskset

__all__ = ["RollgymHarness", "RollgymTaskset"]
