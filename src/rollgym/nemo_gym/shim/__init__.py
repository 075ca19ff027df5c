"""Put this directory first on ``PYTHONPATH`` (``rollgym.nemo_gym.rl.shim_path()``): its
``nemo_gym`` package is rollgym's stand-in for the NeMo Gym modules NeMo RL imports."""
