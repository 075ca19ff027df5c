"""NeMo Gym 0.7 compatibility: its failure vocabulary, its Environment Server episodes, its
materialized task rows, and the entry points NeMo RL calls (``RolloutCollectionHelper``,
``RunHelper``) on rollgym's core. 0.4's flat protocol needs nothing here: rollgym speaks it
natively."""
