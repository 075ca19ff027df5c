"""The one stack of test helpers every test folder shares.

- ``servers``: test-only servers (a scripted model that fails on demand, an echo env that
  counts its calls) and ``refused_url`` (a held port where nothing listens); server processes
  import them as ``tests.support.servers``.
- ``stack``: task rows and files, configs, fast retry policies, and ``running_stack``: model,
  env and tool agent served in-process on 127.0.0.1.
- ``scripted``: HTTP servers that answer on a script, for the client's retry paths.
- ``ledger``: reading a run's output directory and checking the ledger invariant.
- ``failures``: what the model's failure looks like through the agent and the trainer API.
- ``waiting``: polling until a condition holds, with a timeout.
- ``background``: an async context manager entered on a thread's own event loop, for sync code.
- ``procs``: which processes are still alive.
- ``ray_runs``: a run on the test Ray cluster with a fault midway (imports Ray).

Fixtures (a local Ray cluster, a model that is down, ``dead_url``: URLs where nothing listens)
live in ``tests/conftest.py``.
"""
