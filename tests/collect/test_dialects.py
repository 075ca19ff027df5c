"""Row dialects (``rollgym.collect.dialect``): a shape of task row is one object, listed once
where the entry points assemble the list (``rollgym.dialects.ROW_DIALECTS``).

A toy dialect written here, with rows ``{"toy_prompt": ..., "toy_answer": ...}`` sent to an
agent as the flat row it takes and recorded with one field more (``toy``), runs through
``rollgym run`` by adding it to that list, and nothing in ``collect/`` changes. Given no list,
the core speaks the flat row only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

import rollgym.dialects
from rollgym.collect.dialect import Dialects, FlatExchange, RowCheck
from rollgym.collect.records import RolloutItem
from rollgym.collect.route import BY_AGENT, AgentRoute
from rollgym.collect.tasks import scan_tasks
from rollgym.errors import InputError, RollgymError
from rollgym.protocol import check_verified
from rollgym.wire import NG_ROLLOUT_INDEX, NG_TASK_INDEX
from tests.support.cli_here import count_checks, rollgym_here
from tests.support.ledger import assert_ledger_invariant
from tests.support.servers import FAIL_MARKER
from tests.support.stack import ECHO_TOOL, script, stack_data

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True, slots=True)
class ToyExchange:
    """A toy row's attempts: its flat form to the agent; ``toy`` on every record."""

    row: bytes
    prompt: str
    server_retries: bool = False

    def request(self, attempt: int) -> bytes:
        return self.row

    def read(self, answer: Any, attempt: int, server: str) -> dict[str, Any]:
        return {**check_verified(answer, server), "toy": self.prompt}

    def fields(self, err: RollgymError) -> dict[str, Any]:
        return {"toy": self.prompt}


class ToyRows:
    name = "toy"
    marker = b'"toy_prompt"'

    def check(self, row: dict[str, Any], route: AgentRoute | None, where: str) -> RowCheck | None:
        if "toy_prompt" not in row:
            return None
        if not isinstance(row["toy_prompt"], str):
            raise InputError(f"{where}: toy_prompt must be text")
        return RowCheck(BY_AGENT, None, frozenset(self.flat(row)))

    def item(
        self, task_index: int, rollout_index: int, raw: bytes, row: dict[str, Any],
        route: AgentRoute, prior: int,
    ) -> RolloutItem | None:  # fmt: skip
        if "toy_prompt" not in row or route.default is None:
            return None
        body = orjson.dumps(self.flat(row))
        return RolloutItem(
            task_index, rollout_index, body, route.default, prior, dialect=self.name,
            context=row["toy_prompt"],
        )  # fmt: skip

    def exchange(self, item: RolloutItem) -> ToyExchange:
        return ToyExchange(item.row, str(item.context))

    def foreign(self, err: RollgymError, answer: Any, server: str) -> RollgymError | None:
        return None

    @staticmethod
    def flat(row: dict[str, Any]) -> dict[str, Any]:
        """The flat row the agent takes (``tests.support.stack.task_row``'s shape)."""
        params = {
            "input": row["toy_prompt"],
            "tools": [ECHO_TOOL],
            "metadata": {"rollgym_script": script(row["toy_answer"])},
        }
        indices = ("task_index", "rollout_index", NG_TASK_INDEX, NG_ROLLOUT_INDEX)
        stamped = {key: row[key] for key in indices if key in row}
        return {"responses_create_params": params, "expected_answer": row["toy_answer"], **stamped}


TOY = ToyRows()


def test_a_toy_dialect_runs_by_one_line_in_the_entry_points_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_checks(monkeypatch)  # the CLI runs in this process: leave its gc alone
    # The one line: the entry points' list, with the toy dialect added.
    monkeypatch.setattr(rollgym.dialects, "ROW_DIALECTS", (*rollgym.dialects.ROW_DIALECTS, TOY))
    data = stack_data(
        {"concurrency": 2},
        model={
            "impl": "tests.support.servers:FaultyModel",
            "options": {"fail_marker": FAIL_MARKER},
        },
    )
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps(data))
    rows = [
        {"toy_prompt": "task 0", "toy_answer": "v0"},
        {"toy_prompt": f"task 1 {FAIL_MARKER}", "toy_answer": "v1"},  # the model answers 500
        {"toy_prompt": "task 2", "toy_answer": "v2"},
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out = tmp_path / "out"
    code = rollgym_here("run", cfg, "-i", tasks, "-o", out, "--no-progress")
    assert code == 1  # one rollout failed
    rollouts, failures = assert_ledger_invariant(out)
    assert {(r["task_index"], r["toy"], r["reward"]) for r in rollouts} == {
        (0, "task 0", 1.0), (2, "task 2", 1.0),
    }  # fmt: skip
    (failed,) = failures
    assert failed["toy"] == f"task 1 {FAIL_MARKER}"
    assert failed["error"]["type"] == "http_status"
    assert "failure_kind" not in failed  # another dialect's fields stay its own rows'


def test_without_a_list_the_core_speaks_the_flat_row_only(tmp_path: Path) -> None:
    toy = tmp_path / "toy.jsonl"
    toy.write_bytes(orjson.dumps({"toy_prompt": "task 0", "toy_answer": "v0"}) + b"\n")
    with pytest.raises(InputError, match="responses_create_params"):
        scan_tasks(toy)
    assert scan_tasks(toy, dialects=Dialects([TOY])).tasks == 1
    materialized = tmp_path / "ng07.jsonl"
    row = {"task_id": {"taskset": "s", "task_id": "a"}, "task_input": {}}
    materialized.write_bytes(orjson.dumps(row) + b"\n")
    with pytest.raises(InputError, match="responses_create_params"):
        scan_tasks(materialized)
    assert scan_tasks(materialized, dialects=Dialects(rollgym.dialects.ROW_DIALECTS)).tasks == 1


def test_a_flat_items_attempts_are_its_row() -> None:
    item = RolloutItem(0, 0, b'{"x":1}', "agent")
    exchange = Dialects().named(item.dialect).exchange(item)
    assert isinstance(exchange, FlatExchange) and not exchange.server_retries
    assert exchange.request(1) == exchange.request(2) == b'{"x":1}'
    assert exchange.fields(RollgymError("m")) is None
    with pytest.raises(ValueError, match="share a name"):
        Dialects([TOY, TOY])
