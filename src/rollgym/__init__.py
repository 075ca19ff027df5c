"""rollgym: collect RL rollouts from HTTP environments; every rollout ends as a record.

The Python way in (docs/integrations/trainer-api.md):

    import rollgym

    with rollgym.serve_config("config.yaml") as servers:     # the config's servers, started
        groups = servers.client.collect_sync(servers.rows()[:8], repeats=4)

The names below are imported on first use: the CLI and every server process import this
package, and must not pay for the trainer API at each start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollgym.collect.records import FailedRollout, ScoredRollout
    from rollgym.serving import ServeConfig, Servers, serve_config
    from rollgym.trainer import RolloutClient, TaskGroup
    from rollgym.trainer.policy_control import PolicyControl

from rollgym.version import __version__

_HOMES = {
    "serve_config": "rollgym.serving",
    "Servers": "rollgym.serving",
    "ServeConfig": "rollgym.serving",
    "RolloutClient": "rollgym.trainer",
    "TaskGroup": "rollgym.trainer",
    "ScoredRollout": "rollgym.collect.records",
    "FailedRollout": "rollgym.collect.records",
    "PolicyControl": "rollgym.trainer.policy_control",
}

__all__ = [
    "FailedRollout",
    "PolicyControl",
    "RolloutClient",
    "ScoredRollout",
    "ServeConfig",
    "Servers",
    "TaskGroup",
    "__version__",
    "serve_config",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rollgym' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
