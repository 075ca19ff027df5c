"""NeMo RL on rollgym: the entry points NeMo RL calls, with NeMo Gym 0.7's names and signatures.

- ``helpers``: ``RunHelper``, ``RolloutCollectionHelper``, ``BaseServerConfig``,
  ``GlobalConfigDictParserConfig``, ``HEAD_SERVER_KEY_NAME`` and ``shim_path()``;
- ``plan``: NeMo RL's ``env.nemo_gym`` section -> a rollgym config and how to run it;
- ``stack``: the config's servers and the head server ``RunHelper.start`` runs;
- ``collect``: ``run_examples``'s batch through rollgym's rollout core;
- ``results``: rollout records -> the results NeMo RL reads;
- ``shim/``: a ``nemo_gym`` package re-exporting these names; put ``shim_path()`` first on the
  ``PYTHONPATH`` of NeMo RL's Gym actor and NeMo RL's ``from nemo_gym.cli import RunHelper``
  lands here.
"""

from __future__ import annotations

from rollgym.integrations.nemo_rl.helpers import (
    HEAD_SERVER_KEY_NAME,
    BaseServerConfig,
    GlobalConfigDictParserConfig,
    RollgymCompatWarning,
    RolloutCollectionHelper,
    RunHelper,
    shim_path,
)

__all__ = [
    "HEAD_SERVER_KEY_NAME",
    "BaseServerConfig",
    "GlobalConfigDictParserConfig",
    "RollgymCompatWarning",
    "RolloutCollectionHelper",
    "RunHelper",
    "shim_path",
]
