"""``rollgym replay``: run a recorded rollout's environment side again, with the model's outputs
served from the record, and name the first turn and field where it differs.

    OUT_SRC (tasks.jsonl, rollouts.jsonl, run.json)
      -> plan: the rollouts taken (all, --rollouts, --sample), one input row and plan entry each
      -> the config (--config, else run.json's) with each model server its agents call replaced
         by the replay model (rollgym.replay.model), which serves the recorded turns
      -> run_collection: the real agents and environments (seed, every tool call, the verifier)
      -> compare each new record with its recorded one -> OUT/replay.json

A fork (``fork_at=K``) is the same run whose replay model hands turns K and after to the live
model the config names (kept beside it as ``<model>_live``): the new rollout is recorded in OUT's
ledger with its parent and K (``rollgym_parent`` on its row), and its first K turns are checked
against the record. The trainer API's ``rollgym.trainer.fork`` is this with one rollout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from rollgym.collect.launchers import RunAgents, local_launcher
from rollgym.collect.layout import RunDir
from rollgym.collect.orchestrate import run_collection
from rollgym.collect.rundir import RunOutcome, write_json
from rollgym.config import Config, ServerConfig, parse_config
from rollgym.errors import ConfigError, root_record
from rollgym.replay.compare import Divergence, first_divergence
from rollgym.replay.model import ReplayModel
from rollgym.replay.plan import INPUT_FILE, PLAN_FILE, PlanEntry, select, write_plan
from rollgym.replay.report import (
    MISMATCH_LOG,
    REPORT_FILE,
    ReplayReport,
    RolloutReplay,
    environment_change,
)
from rollgym.replay.turns import Turn, split_turns
from rollgym.reverify.source import RecordedRun

__all__ = [
    "REPORT_FILE",
    "Divergence",
    "ReplayModel",
    "ReplayReport",
    "RolloutReplay",
    "Turn",
    "first_divergence",
    "recorded_config",
    "replay",
    "replay_config",
    "split_turns",
]

log = logging.getLogger("rollgym.replay")

REPLAY_IMPL = "rollgym.replay.model:ReplayModel"


def recorded_config(source: Path) -> Config:
    """The config ``source`` ran with (its ``run.json``); a usage error if it has none."""
    files = RunDir(source)
    data = files.read_json(files.run_json.name).get("config")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{files.run_json}: no 'config' recorded; give the run's config with --config"
        )
    where = data.get("source") or str(files.run_json)
    data = {k: v for k, v in data.items() if k != "source"}
    used = files.read_json(files.run_json.name).get("collect")
    if isinstance(used, dict):
        # The collect options the run actually used (an --agent given on its command line).
        data["collect"] = {**(data.get("collect") or {}), **used}
    return parse_config(data, str(where))


def replay_config(
    config: Config, plan: Path, log_path: Path, *, fork: bool = False
) -> tuple[Config, set[str]]:
    """``config`` with each model server its agents call replaced by the replay model serving
    ``plan`` (with ``fork``, the original kept as ``<name>_live`` for the turns past the fork);
    and the names replaced. A usage error names what the replay cannot stand in for."""
    where = config.source or "config"
    servers = dict(config.servers)
    models: set[str] = set()
    for name, server in config.servers.items():
        if server.kind == "environment":
            raise ConfigError(
                f"{where}: servers.{name} is an environment server (its own tool starts its "
                "agent and model): replay needs the agents rollgym starts"
            )
        if server.kind != "agent":
            continue
        if server.url is not None:
            raise ConfigError(
                f"{where}: servers.{name}.url: an agent already running calls the model it was "
                "started with; replay needs the agents rollgym starts (impl:)"
            )
        model = server.options.get("model", "model")
        if not isinstance(model, str) or model not in servers:
            raise ConfigError(f"{where}: servers.{name}.options.model: no model server {model!r}")
        models.add(model)
    for name, server in config.servers.items():
        if server.kind == "agent" or name in models:
            continue
        shared = sorted(models & set(_names_in(server.options)))
        if shared:
            raise ConfigError(
                f"{where}: servers.{name}.options names model server {shared[0]!r}, which the "
                "agents call too: give it a server of its own, so the replay serves only the "
                "agents' turns"
            )
    for model in sorted(models):
        live = None
        if fork:
            live = _free_name(f"{model}_live", servers)
            servers[live] = config.servers[model]
        servers[model] = ServerConfig(
            kind="model", impl=REPLAY_IMPL,
            options={"plan": str(plan), "log": str(log_path), "live": live},
        )  # fmt: skip
    data = config.model_dump(context={"keep_secrets": True})
    data["servers"] = {
        n: s.model_dump(context={"keep_secrets": True}) for n, s in servers.items()
    }  # fmt: skip
    return parse_config({k: v for k, v in data.items() if k != "source"}, where), models


def _names_in(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _names_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from _names_in(v)


def _free_name(name: str, taken: dict[str, Any]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}{n}"
    return candidate


async def replay(
    source: Path,
    output: Path,
    *,
    config: Config | None = None,
    rollouts: str | None = None,
    sample: int | None = None,
    seed: int = 0,
    fork_at: int | None = None,
    copies: int = 1,
    concurrency: int | None = None,
    progress: bool = True,
    log_level: str = "WARNING",
    agent_dialects: tuple[Any, ...] = (),
    dialects: Iterable[Any] = (),
) -> tuple[RunOutcome, ReplayReport]:
    """Replay ``source``'s rollouts (all, the ids ``rollouts``, or ``sample`` of them) into
    ``output``; with ``fork_at``, fork each at that turn onto ``config``'s live model (``copies``
    times: several continuations of one prefix). Write and return the report
    (``output/replay.json``) with the replay run's outcome."""
    output = _check(source, output, fork_at)
    base = config if config is not None else recorded_config(source)
    recorded = RecordedRun(source)
    try:
        keys = [key for key in select(recorded, source, rollouts, sample, seed)
                for _ in range(max(1, copies))]  # fmt: skip
        cfg, replaced = replay_config(
            base, output / PLAN_FILE, output / MISMATCH_LOG, fork=fork_at is not None
        )
        collect = cfg.collect.model_copy(
            update={
                "repeats": 1, "limit": None,
                **({"concurrency": concurrency} if concurrency else {}),
            }
        )  # fmt: skip
        agents = RunAgents.of(cfg, collect)  # checked before anything is written
        launcher = local_launcher(cfg, agents, log_dir=RunDir(output).logs, log_level=log_level)
        plan = write_plan(recorded, keys, output, fork_at)
        outcome = await run_collection(
            cfg, collect, output / INPUT_FILE, output, launcher, agents=agents,
            progress=progress, agent_dialects=agent_dialects, dialects=dialects,
        )  # fmt: skip
        report = compare_run(recorded, plan, output, fork_at)
    finally:
        recorded.close()
    report.environment = environment_change(source, output, replaced)
    write_json(output / REPORT_FILE, report.to_dict())
    return outcome, report


def _check(source: Path, output: Path, fork_at: int | None) -> Path:
    """Usage errors before anything is written; ``output`` made absolute (the replay model
    runs in a process of its own)."""
    if not RunDir(source).tasks.exists():
        raise ConfigError(f"{source}: not a run directory (no tasks.jsonl)")
    if source.resolve() == output.resolve():
        raise ConfigError(f"--output {output}: must differ from the run being replayed")
    if fork_at is not None and fork_at < 0:
        raise ConfigError(f"--fork-at {fork_at}: must be a turn index >= 0")
    if RunDir(output).rollouts.exists():
        raise ConfigError(f"--output {output}: holds a run already; replay into a new directory")
    return output.resolve()


def compare_run(
    recorded: RecordedRun, plan: list[PlanEntry], output: Path, fork_at: int | None
) -> ReplayReport:
    """Each plan entry's new record (in ``output``'s ledger) against its recorded one."""
    files = RunDir(output)
    new = {f"{got.key[0]}:{got.key[1]}": got.record for got in files.successes()}
    failed = {f"{got.key[0]}:{got.key[1]}": got.record for got in files.failed()}
    noted = _mismatches(output / MISMATCH_LOG)
    report = ReplayReport(str(recorded.out_dir), str(output), fork_at=fork_at)
    report.skipped = len(set(recorded.failed) - set(recorded.succeeded))
    for entry in plan:
        task, _, rollout = entry.parent.partition(":")
        old = recorded.record((int(task), int(rollout))) or {}
        got = RolloutReplay(entry.parent, entry.rollout, "identical", fork_at=fork_at)
        if entry.rollout in new:
            record = new[entry.rollout]
            got.reward = record.get("reward")
            got.divergence = first_divergence(old, record, turns=fork_at)
        elif entry.rollout in noted:
            why = noted[entry.rollout]
            got.divergence = Divergence(why.get("turn"), "replay model", None, why.get("why"))
        elif entry.rollout in failed:
            error = root_record(failed[entry.rollout].get("error") or {})
            text = f"{error.get('type')}: {error.get('message')}"
            got.divergence = Divergence(None, "failure", old.get("reward"), text)
        else:
            got.divergence = Divergence(None, "failure", old.get("reward"), "not replayed")
        if got.divergence is not None:
            got.status = "diverged"
        report.rollouts.append(got)
    return report


def _mismatches(path: Path) -> dict[str, dict[str, Any]]:
    """The replay model's notes, first per rollout."""
    out: dict[str, dict[str, Any]] = {}
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            note = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line torn by a killed server
        if isinstance(note, dict) and isinstance(note.get("rollout"), str):
            out.setdefault(note["rollout"], note)
    return out
