"""Python solutions run against unit tests in a sandbox (NeMo Gym code_gen rows)."""
