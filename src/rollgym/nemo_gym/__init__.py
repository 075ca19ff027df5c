"""NeMo Gym 0.7 compatibility: its failure vocabulary, its Environment Server episodes, its
materialized task rows. 0.4's flat protocol needs nothing here: rollgym speaks it natively.
NeMo RL's entry points (``RolloutCollectionHelper``, ``RunHelper``) are a trainer integration:
``rollgym.integrations.nemo_rl``."""
