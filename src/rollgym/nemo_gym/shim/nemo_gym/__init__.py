"""rollgym's stand-in for NeMo Gym, as NeMo RL imports it (``rollgym.nemo_gym.rl``): only the
entry points NeMo RL calls are here."""
