"""The agent inside the collector's process (``collect.agent_in_process``): one hop fewer.

Its launcher, ``InProcessAgents`` (what the option does and what it costs), and
``in_process_agents`` live with every other launcher in ``rollgym.collect.launchers``; they are
re-exported here for the imports of this older path.
"""

from rollgym.collect.launchers import InProcessAgents, in_process_agents

__all__ = ["InProcessAgents", "in_process_agents"]
