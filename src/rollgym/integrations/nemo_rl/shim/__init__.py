"""Put this directory first on ``PYTHONPATH`` (``rollgym.integrations.nemo_rl.shim_path()``): its
``nemo_gym`` package is rollgym's stand-in for the NeMo Gym modules NeMo RL imports."""
