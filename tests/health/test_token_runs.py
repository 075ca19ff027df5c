"""The token checks on real token data: rollouts collected through ``openai_proxy``
(``return_token_ids``) in front of the vLLM-shaped upstream of ``tests/models``, whose usage
and ids are vLLM's. Clean data passes ``token_count_mismatch`` and ``token_drift`` (judged,
not unobserved); a template that re-serialises tool calls fails ``token_drift``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollgym.health import check_run
from tests.health.seeded import write_jsonl
from tests.models.test_training_tokens import agent_stack, row, run
from tests.models.vllm_double import VllmDouble

pytestmark = pytest.mark.timeout(60)


async def collected(drift: bool = False, reasoning: str | None = None) -> dict[str, Any]:
    upstream = VllmDouble(reasoning=reasoning) if reasoning else VllmDouble()
    upstream.tool_turns = 2
    upstream.drift = drift
    async with agent_stack(upstream) as agent:
        return await run(agent, row())


def as_run(root: Path, verified: list[dict[str, Any]]) -> Path:
    root.mkdir()
    keys = [{"task_index": i, "rollout_index": 0} for i in range(len(verified))]
    write_jsonl(root / "tasks.jsonl", keys)
    write_jsonl(root / "rollouts.jsonl", [{**v, **k} for v, k in zip(verified, keys, strict=True)])
    return root


async def test_real_token_data_passes_the_token_checks(tmp_path: Path) -> None:
    records = [await collected(), await collected(reasoning="Use the tool.")]
    report = check_run(as_run(tmp_path / "run", records))
    got = {c.id: c for c in report.checks}
    assert report.exit_code == 0, report.failed
    assert (got["token_count_mismatch"].outcome, got["token_count_mismatch"].of) == ("pass", 2)
    assert (got["token_drift"].outcome, got["token_drift"].of) == ("pass", 2)
    assert (got["zero_completion_tokens"].outcome, got["zero_completion_tokens"].of) == ("pass", 2)


async def test_real_drift_fails_token_drift(tmp_path: Path) -> None:
    report = check_run(as_run(tmp_path / "run", [await collected(), await collected(drift=True)]))
    assert report.failed == ("token_drift",)
    drift = next(c for c in report.checks if c.id == "token_drift")
    assert (drift.count, drift.of) == (1, 2)
    assert drift.examples[0].note == "drifted_turns 2"


async def test_real_token_data_tampered_fails_token_count_mismatch(tmp_path: Path) -> None:
    good, cut = await collected(), await collected()
    calls = [i for i in cut["response"]["output"] if "generation_token_ids" in i]
    calls[0]["generation_token_ids"] = calls[0]["generation_token_ids"][:-1]  # one id lost
    calls[0]["generation_log_probs"] = calls[0]["generation_log_probs"][:-1]
    report = check_run(as_run(tmp_path / "run", [good, cut]))
    assert report.failed == ("token_count_mismatch",)
    note = next(c for c in report.checks if c.id == "token_count_mismatch").examples[0].note
    assert note.startswith("usage.output_tokens")
