"""``rollgym reverify``: score the recorded rollouts of a run again, with the current verifier.

    OUT (tasks.jsonl, rollouts.jsonl, failures.jsonl)
      -> OUT2/input.jsonl (OUT's tasks, once each) -> run_collection(..., ReverifyDispatcher)
         each rollout recorded in OUT:  /seed_session, its tool calls, /verify (row + response)
         each rollout failed in OUT:    its failure, copied as it was
         each rollout not yet in OUT:   left pending (OUT2 ends aborted; --resume finishes it)
      -> OUT2: the ledger, metrics.json, run.json of a normal run, and reverify_diff.json

It is a run like any other (the one ``run_collection``, ``Collector``, ``Recorder`` and ledger), so
``--resume``, concurrency, the failure budget and typed failures are those of ``rollgym run``;
only the runner differs: it calls the environment's resources server instead of the agent:
``/seed_session``, the recorded tool calls again (a stateful environment verifies against its
session), then ``/verify`` with the recorded response.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rollgym.collect.launchers import ResourcesOnly, RunAgents
from rollgym.collect.layout import RunDir
from rollgym.collect.orchestrate import run_collection
from rollgym.collect.peers import resources_of
from rollgym.collect.rollout import RolloutPolicy
from rollgym.collect.rundir import RunOutcome, write_json
from rollgym.config import CollectConfig, Config
from rollgym.errors import ConfigError
from rollgym.reverify.diff import DIFF_FILE, ReverifyDiff, RewardChange, diff_runs
from rollgym.reverify.runner import ReverifyDispatcher, VerifyRunner, replay_tools
from rollgym.reverify.source import RecordedRun, write_input

__all__ = [
    "DIFF_FILE",
    "INPUT_FILE",
    "RecordedRun",
    "ResourcesOnly",
    "ReverifyDiff",
    "ReverifyDispatcher",
    "RewardChange",
    "VerifyRunner",
    "diff_runs",
    "replay_tools",
    "reverify",
    "write_input",
]

log = logging.getLogger("rollgym.reverify")

INPUT_FILE = "input.jsonl"


def _input(source: Path, output: Path) -> tuple[Path, int]:
    """``output``'s input file, written from ``source``'s tasks, and their repeats."""
    if source.resolve() == output.resolve():
        raise ConfigError(f"--output {output}: must differ from the run being re-verified")
    path = output / INPUT_FILE
    return path, write_input(source, path)


async def reverify(
    config: Config,
    collect: CollectConfig,
    source: Path,
    output: Path,
    *,
    resume: bool = False,
    agent: str | None = None,
    progress: bool = True,
    log_level: str = "WARNING",
) -> tuple[RunOutcome, ReverifyDiff]:
    """Re-verify every recorded rollout of ``source`` into ``output``; write and return the
    diff (``output/reverify_diff.json``) with the run's outcome."""
    # Resolved once; no agent runs here (the resources server stands in for it), so none in
    # this process either, whatever collect.agent_in_process says.
    agents = RunAgents(config.agent_name(agent or collect.agent))
    agent_name = agents.name
    res_name = resources_of(config, agent_name)
    # The launcher checks the config's servers: before the input below is written.
    launcher = ResourcesOnly(config, agent_name, res_name, RunDir(output).logs, log_level)
    input_path, repeats = _input(source, output)
    collect = collect.model_copy(
        update={"repeats": repeats, "limit": None, "agent_in_process": False}
    )
    recorded = RecordedRun(source)
    try:
        dispatcher = ReverifyDispatcher(
            recorded, res_name, config.servers[res_name].retry,
            RolloutPolicy.from_collect(collect), collect.concurrency,
        )  # fmt: skip
        outcome = await run_collection(
            config, collect, input_path, output, launcher, dispatcher=dispatcher,
            resume=resume, agents=agents, progress=progress,
        )  # fmt: skip
    finally:
        recorded.close()
    diff = diff_runs(source, output, collect.pass_threshold)
    write_json(output / DIFF_FILE, diff.to_dict())
    return outcome, diff
