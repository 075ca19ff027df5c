"""rollgym: collect RL rollouts from HTTP environments; every rollout ends as a record.

The Python way in (docs/integrations/trainer-api.md):

    import rollgym

    with rollgym.serve_config("config.yaml") as servers:     # the config's servers, started
        groups = servers.client.collect_sync(servers.rows()[:8], repeats=4)

``__all__`` is the public API (docs/reference/api.md documents exactly it): starting a config's
servers, the trainer client and stream, the records, the server bases an environment or agent
subclasses, ``tool``, and the errors users catch. Each name also stays importable from its home
(``_HOMES``), and is imported from there on first use: the CLI and every server process import
this package, and must not pay for the trainer API at each start. Other modules are documented
by their path (integrations, health) or are internal.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollgym.collect.records import FailedRollout, ScoredRollout
    from rollgym.errors import (
        ConfigError,
        DeadlineExceeded,
        HTTPStatusError,
        InputError,
        InvalidRequest,
        LaunchError,
        PausedTooLong,
        ProtocolError,
        RollgymError,
        RunAborted,
        StaleRollout,
        TokenDataError,
        TransportError,
        WeightsNotRestored,
    )
    from rollgym.server.agent import AgentServer, RunContext
    from rollgym.server.gymnasium import GymnasiumServer, Reset, Step
    from rollgym.server.resources import ResourcesServer, Session, tool
    from rollgym.serving import ServeConfig, Servers, serve_config
    from rollgym.trainer import (
        BudgetRules,
        PolicyControl,
        RolloutClient,
        RolloutStream,
        TaskGroup,
        collect_batch,
        collect_batch_sync,
        fork,
        fork_sync,
        plain_error,
    )

from rollgym.version import __version__

_HOMES = {
    # a config's servers, started from Python
    "ServeConfig": "rollgym.serving",
    "Servers": "rollgym.serving",
    "serve_config": "rollgym.serving",
    # collecting inside a trainer
    "BudgetRules": "rollgym.trainer",
    "PolicyControl": "rollgym.trainer",
    "RolloutClient": "rollgym.trainer",
    "RolloutStream": "rollgym.trainer",
    "TaskGroup": "rollgym.trainer",
    "collect_batch": "rollgym.trainer",
    "collect_batch_sync": "rollgym.trainer",
    "fork": "rollgym.trainer",
    "fork_sync": "rollgym.trainer",
    "plain_error": "rollgym.trainer",
    # what a rollout ends as
    "FailedRollout": "rollgym.collect.records",
    "ScoredRollout": "rollgym.collect.records",
    # writing an environment
    "ResourcesServer": "rollgym.server.resources",
    "Session": "rollgym.server.resources",
    "tool": "rollgym.server.resources",
    # writing a Gymnasium-style environment
    "GymnasiumServer": "rollgym.server.gymnasium",
    "Reset": "rollgym.server.gymnasium",
    "Step": "rollgym.server.gymnasium",
    # writing an agent
    "AgentServer": "rollgym.server.agent",
    "RunContext": "rollgym.server.agent",
    # the errors users catch (the tree: rollgym.errors)
    "ConfigError": "rollgym.errors",
    "DeadlineExceeded": "rollgym.errors",
    "HTTPStatusError": "rollgym.errors",
    "InputError": "rollgym.errors",
    "InvalidRequest": "rollgym.errors",
    "LaunchError": "rollgym.errors",
    "PausedTooLong": "rollgym.errors",
    "ProtocolError": "rollgym.errors",
    "RollgymError": "rollgym.errors",
    "RunAborted": "rollgym.errors",
    "StaleRollout": "rollgym.errors",
    "TokenDataError": "rollgym.errors",
    "TransportError": "rollgym.errors",
    "WeightsNotRestored": "rollgym.errors",
}
"""Each public name and the module it is imported from on first use."""

__all__ = [
    "AgentServer",
    "BudgetRules",
    "ConfigError",
    "DeadlineExceeded",
    "FailedRollout",
    "GymnasiumServer",
    "HTTPStatusError",
    "InputError",
    "InvalidRequest",
    "LaunchError",
    "PausedTooLong",
    "PolicyControl",
    "ProtocolError",
    "Reset",
    "ResourcesServer",
    "RollgymError",
    "RolloutClient",
    "RolloutStream",
    "RunAborted",
    "RunContext",
    "ScoredRollout",
    "ServeConfig",
    "Servers",
    "Session",
    "StaleRollout",
    "Step",
    "TaskGroup",
    "TokenDataError",
    "TransportError",
    "WeightsNotRestored",
    "__version__",
    "collect_batch",
    "collect_batch_sync",
    "fork",
    "fork_sync",
    "plain_error",
    "serve_config",
    "tool",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rollgym' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
