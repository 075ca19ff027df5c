"""The echo environment: the smallest useful resources server.

Tool ``echo(text)`` returns ``{"echo": text}``; verify gives reward 1.0 when the final answer
contains the task's ``expected_answer``. Used by benchmarks (framework cost with no
environment cost) and by tests of the collector.
"""

from __future__ import annotations

from typing import Any

from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session, tool


class EchoEnv(ResourcesServer):
    row_fields = frozenset({"expected_answer"})
    reverify_mode = "stateless"  # verify reads the row and the reply

    @tool
    async def echo(self, session: Session, text: str) -> dict[str, Any]:
        """Return the text unchanged."""
        return {"echo": text}

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> float:
        expected = str(task.get("expected_answer", ""))
        return 1.0 if expected and expected in output_text(response) else 0.0
