"""``MCQAEnv``: multiple-choice questions scored by the option letter the reply chose, with the
same reward as NeMo Gym 0.4.0's ``mcqa`` for the rows it accepts.

Task fields (``task.py``): ``options``, ``expected_answer`` (a letter), and optionally
``grading_mode`` and ``template_metadata.output_regex`` (``grading.py``). The reply is all the
assistant's output text (``protocol.output_text``). Option ``grading_mode`` overrides every row's.

Besides ``reward``, verify answers ``extracted`` (1/0: was a single choice found at all, so an
unreadable format shows apart from a wrong answer) and ``extracted_answer`` (the letter or null).
"""

from __future__ import annotations

from typing import Any

from rollgym.envs.mcqa.extract import extract_choice
from rollgym.envs.mcqa.grading import choose
from rollgym.envs.mcqa.task import GradingMode, MCQATask, option_letters, parse_task
from rollgym.envs.rows import mean_field
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session


class MCQAEnv(ResourcesServer):
    """Multiple-choice QA; reward 1.0 when the chosen letter is ``expected_answer``."""

    row_fields = frozenset({"options", "expected_answer", "grading_mode", "template_metadata"})
    required_row_fields = frozenset({"expected_answer"})  # options may be absent
    reverify_mode = "stateless"  # verify reads the row and the reply

    class Options(ResourcesServer.Options):
        grading_mode: GradingMode | None = None
        """Grade every row in this mode, whatever the row says."""

    options: Options

    def mode(self, task: MCQATask) -> GradingMode:
        return self.options.grading_mode or task.mode or task.default_mode

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        parsed = parse_task(task)
        choice = choose(output_text(response), parsed, self.mode(parsed))
        return {
            "reward": 1.0 if choice == parsed.expected else 0.0,
            "extracted": int(choice is not None),
            "extracted_answer": choice,
        }

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        return mean_field(rollouts, "extracted", "extraction_rate")


__all__ = ["MCQAEnv", "extract_choice", "option_letters"]
