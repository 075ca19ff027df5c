"""OpenEnv both ways (openenv-core 0.3.0, the ``openenv`` extra).

- rollgym's agent drives an OpenEnv environment: ``openenv_agent`` (``rollgym.openenv.agent``)
  plays one OpenEnv session per rollout over ``/ws`` (``rollgym.openenv.session``), and
  ``impl: openenv`` (``rollgym.openenv.host``) serves an OpenEnv app as a server of the run.
- any rollgym environment served as an OpenEnv environment: ``rollgym serve-openenv``
  (``rollgym.openenv.serve``), openenv-core's own server in front of a rollgym resources server.

Its failures become rollgym errors in one place: ``rollgym.openenv.translate``.
"""
