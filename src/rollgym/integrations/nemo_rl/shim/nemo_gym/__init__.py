"""rollgym's stand-in for NeMo Gym, as NeMo RL imports it (``rollgym.integrations.nemo_rl``): only the
entry points NeMo RL calls are here."""
