"""The same rows through both agents: rollgym's (``rollgym run``) and NeMo Gym's
(``simple_agent``'s ``/run``), with the same deterministic model outputs."""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from interop.nemo import NG04, NemoGym, http_json
from interop.rollgym_side import (
    read_jsonl,
    rollgym_run,
    tool_agent_config,
    write_config,
    write_jsonl,
)


def example_rows(
    resources_server: str, name: str = "example.jsonl", gym: NemoGym = NG04
) -> list[dict[str, Any]]:
    path = gym.site_packages() / "resources_servers" / resources_server / "data" / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def scripted(row: dict[str, Any], script: list[dict[str, Any]]) -> dict[str, Any]:
    """``row`` with a script for rollgym's scripted model. A JSON string, since the Responses
    API's metadata (which NeMo Gym validates) maps keys to strings."""
    row = copy.deepcopy(row)
    params = row["responses_create_params"]
    params["metadata"] = {**(params.get("metadata") or {}), "rollgym_script": json.dumps(script)}
    return row


def nemo_agent_answers(
    url: str, rows: list[dict[str, Any]], *, concurrency: int = 4
) -> list[tuple[int, Any]]:
    """(status, body) of ``/run`` at ``url`` for each row: a NeMo Gym agent, or on 0.7 the
    ``legacy_agent`` relay in front of one (it relays the row and the answer unchanged)."""

    def one(row: dict[str, Any]) -> tuple[int, Any]:
        return http_json(url + "/run", row, timeout=120)

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, rows))


def nemo_agent_rewards(
    agent_url: str, rows: list[dict[str, Any]], *, concurrency: int = 4
) -> list[tuple[int, Any]]:
    """(status, reward or error body) of NeMo Gym's agent ``/run`` for each row."""
    answers = nemo_agent_answers(agent_url, rows, concurrency=concurrency)
    return [(st, body.get("reward") if st == 200 else body) for st, body in answers]


def rollgym_rewards(
    model_url: str,
    env_url: str,
    rows: list[dict[str, Any]],
    out: Path,
    *,
    impl: str = "tool_agent",
    concurrency: int = 4,
) -> tuple[int, list[dict[str, Any] | None]]:
    """``rollgym run`` with rollgym's agent: (exit code, the rollout of each row or None)."""
    out.mkdir(parents=True, exist_ok=True)
    config = write_config(
        out / "config.yaml",
        tool_agent_config(model_url, env_url, impl=impl, concurrency=concurrency),
    )
    tasks = write_jsonl(out / "rows.jsonl", rows)
    # Rows may name NeMo Gym's agent (agent_ref): run them all with rollgym's.
    code = rollgym_run(config, out / "run", "--input", str(tasks), "--agent", "agent")
    found: list[dict[str, Any] | None] = [None] * len(rows)
    for rollout in read_jsonl(out / "run" / "rollouts.jsonl"):
        found[rollout["task_index"]] = rollout
    return code, found


def run_log(out: Path) -> str:
    log = out / "run.log"
    failures = out / "run" / "failures.jsonl"
    text = log.read_text()[-3000:] if log.exists() else ""
    return text + (failures.read_text()[:3000] if failures.exists() else "")
