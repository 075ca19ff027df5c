"""The masking switches beside ``collect.mask_exploits``: ``rollgym run --mask-exploits`` (and
``--keep-exploits``, overriding a config that masks), and the trainer API's ``mask_exploits``
(on the client, per ``collect`` call, and on a stream). A masked exploit keeps its reward and
leaves every reward statistic; it is never a 0."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.trainer import RolloutClient
from tests.support.stack import running_stack, task_row

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
EXIT = "{tool_output}\n```python\nimport os\nos._exit(0)\n```"
"""Says the answer (the echo environment pays it) and ends the process before any test."""


def _rows() -> list[dict[str, Any]]:
    return [task_row(0), task_row(1, say=EXIT)]


CONFIG = """servers:
  model: {{kind: model, impl: scripted}}
  echo: {{kind: resources, impl: echo}}
  agent: {{kind: agent, impl: tool_agent, options: {{model: model, resources: echo}}}}
collect: {{input: tasks.jsonl, mask_exploits: {mask}}}
"""


async def _run(tmp_path: Path, mask: bool, *flags: str) -> dict[int, dict[str, Any]]:
    (tmp_path / "tasks.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in _rows()))
    (tmp_path / "config.yaml").write_text(CONFIG.format(mask=str(mask).lower()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rollgym", "run", "config.yaml", "--output", "out",
        "--no-progress", *flags, cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 150)
    assert proc.returncode == 0, out.decode()
    lines = (tmp_path / "out" / "rollouts.jsonl").read_bytes().splitlines()
    return {r["task_index"]: r for r in map(orjson.loads, lines)}


@pytest.mark.parametrize(
    ("config", "flags", "masked"),
    [(False, ("--mask-exploits",), True), (True, ("--keep-exploits",), False), (True, (), True)],
    ids=["flag masks", "flag keeps over config", "config masks"],
)
async def test_run_masks_exploits_as_the_flag_says(
    tmp_path: Path, config: bool, flags: tuple[str, ...], masked: bool
) -> None:
    by_task = await _run(tmp_path, config, *flags)
    exploit = by_task[1]
    assert exploit["reward"] == 1.0  # the environment's, kept
    assert exploit["integrity"]["verdict"] == "exploit"
    assert exploit.get("mask_sample") is (True if masked else None)
    assert exploit["integrity"].get("masked") is (True if masked else None)
    assert by_task[0]["integrity"]["verdict"] == "clean" and "mask_sample" not in by_task[0]
    metrics = orjson.loads((tmp_path / "out" / "metrics.json").read_bytes())
    assert metrics["reward"]["mean"] == 1.0  # both paid; a masked one is in no statistic
    assert metrics["integrity"]["masked"] == (1 if masked else 0)


async def test_the_trainer_api_masks_exploits_when_switched_on() -> None:
    async with running_stack() as stack:
        url = stack.agent_url
        plain = RolloutClient(url)
        masking = RolloutClient(url, mask_exploits=True)
        try:
            tagged_only = await plain.collect(_rows())
            masked = await masking.collect(_rows())
            overridden = await masking.collect(_rows(), mask_exploits=False)
            one = await plain.run(_rows()[1], mask_exploits=True)
            async with masking.stream(_rows()) as stream:
                streamed = {g.task_index: g async for g in stream}
        finally:
            await plain.aclose()
            await masking.aclose()

    for groups in (tagged_only, overridden):
        exploit = groups[1].rollouts[0]
        assert exploit.integrity.verdict == "exploit" and not exploit.masked  # type: ignore[union-attr]
        assert groups[1].rewards == [1.0]
    for groups in (masked, streamed):
        exploit = groups[1].rollouts[0]
        assert exploit.masked and exploit.reward == 1.0  # type: ignore[union-attr]
        assert exploit.integrity.masked is True  # type: ignore[union-attr]
        assert groups[1].rewards == [] and groups[1].masked == [exploit]
        assert groups[0].rewards == [1.0]  # the clean row is untouched
    assert one.masked and one.reward == 1.0  # type: ignore[union-attr]
    # A client sent to a Ray actor keeps its switch.
    import pickle

    assert pickle.loads(pickle.dumps(RolloutClient(url, mask_exploits=True))).mask_exploits
