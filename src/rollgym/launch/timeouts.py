"""The launcher's start-up timeout, in a module that imports nothing: the command line shows it
as a default in ``--help`` without importing the launcher (asyncio, subprocess, sockets)."""

STARTUP_TIMEOUT = 30.0
"""Seconds for every local server to answer ``/health``: imports and model loading included."""
