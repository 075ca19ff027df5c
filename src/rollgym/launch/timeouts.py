"""The launcher's start-up and warm-up timeouts, in a module that imports nothing: the command line shows it
as a default in ``--help`` without importing the launcher (asyncio, subprocess, sockets)."""

STARTUP_TIMEOUT = 30.0
"""Seconds for every local server to answer ``/health``: imports and model loading included."""

WARMUP_TIMEOUT = 300.0
"""Seconds, from its start, for a server that answers ``/health`` with ``starting`` (a scoring
pool warming up: ``rollgym.wire.HEALTH_STARTING``) to be ready. Longer than the start-up bound,
which still holds for a process that never answers at all: warming workers on a machine busy
with other work can take longer than 30 s, and is no fault. Longer too than a pool's own bound
(``rollgym.server.cpu_pool.WARM_UP_TIMEOUT``, 120 s), so a server's own failure is reported."""
