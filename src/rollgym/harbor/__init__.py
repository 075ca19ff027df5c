"""Harbor's task format (``task.toml``, ``instruction.md``, ``environment/Dockerfile``,
``tests/test.sh``, ``solution/solve.sh``) as a rollgym environment: tasks run in containers,
verified in a fresh container the agent never touched (``trial``)."""
