"""Rollouts whose model called tools their rows do not declare: said, never a silent 0.

rollgym's ``tool_agent`` runs only the tools a row declares (``responses_create_params.tools``)
and answers any other call with a tool error; NeMo Gym's ``simple_agent`` sends every call to
the resources server. So a row that declares no tools (``example_mcp_weather``'s) pays 1
under that agent and 0 under rollgym's, with nothing failing. The agent names such tools
in the record (``rollgym_undeclared_tools``); this listener warns at the first one (so a long
run says it early) and sums them up for ``run.json``'s ``warnings``.
"""

from __future__ import annotations

import logging
from collections import Counter

from rollgym.agents.tool_agent import UNDECLARED_TOOLS
from rollgym.collect.records import RolloutRecord, ScoredRollout

log = logging.getLogger("rollgym.collect")

TASKS_SHOWN = 10


class UndeclaredTools:
    """A recorder listener counting rollouts with undeclared tool calls (``agents``: the
    run's ``tool_agent`` servers, named in the advice)."""

    def __init__(self, agents: list[str]) -> None:
        self.agents = agents
        self.rollouts = 0
        self.tools: Counter[str] = Counter()
        self.tasks: set[int] = set()

    def __call__(self, record: RolloutRecord) -> None:
        if not isinstance(record, ScoredRollout):
            return
        names = record.verified.get(UNDECLARED_TOOLS)
        if not isinstance(names, list) or not names:
            return
        self.rollouts += 1
        self.tasks.add(record.task_index)
        self.tools.update(str(n) for n in names)
        if self.rollouts == 1:
            log.warning("%s", self._message(f"task {record.task_index}'s rollout"))

    def summary(self) -> str | None:
        """The run's warning, or None when no rollout called an undeclared tool."""
        if not self.rollouts:
            return None
        tasks = sorted(self.tasks)
        shown = ", ".join(map(str, tasks[:TASKS_SHOWN])) + (
            " ..." if len(tasks) > TASKS_SHOWN else ""
        )
        return self._message(f"{self.rollouts} rollout(s) (tasks {shown})")

    def _message(self, who: str) -> str:
        tools = ", ".join(sorted(self.tools))
        where = (
            " or set servers.<agent>.options.tools_from_server: true"
            if not self.agents
            else " or set "
            + " / ".join(f"servers.{a}.options.tools_from_server: true" for a in self.agents)
        )
        return (
            f"{who} called tools the row does not declare (responses_create_params.tools): "
            f"{tools}. rollgym's tool_agent refuses such calls (the model gets a tool error), so "
            "these rollouts may score 0 where NeMo Gym's simple_agent, which sends any call to "
            f"the resources server, pays. Declare the tools in the rows,{where} when the "
            "resources server lists them (GET /tools: rollgym's environments do, NeMo Gym's "
            "do not)"
        )
