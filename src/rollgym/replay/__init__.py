"""``rollgym replay``: run a recorded rollout's environment side again, with the model's outputs
served from the record, and name the first turn and field where it differs.

    OUT_SRC (tasks.jsonl, rollouts.jsonl, run.json)
      -> plan: the rollouts taken (all, --rollouts, --sample), one input row and plan entry each
      -> the config (--config, else run.json's) with each model server its agents call replaced
         by the replay model (rollgym.replay.model), which serves the recorded turns
      -> run_collection: the real agents and environments (seed, every tool call, the verifier)
      -> compare each new record with its recorded one -> OUT/replay.json

Its memory is bounded by the concurrency, not by the run: the recorded run, the replay's
ledger and the plan are indexed by byte offset (a key and an offset a rollout), a record is
read when its turn comes and dropped after, the replay model holds the entries of the rollouts
in flight (``rollgym.replay.model``), and the report is written entry by entry
(``rollgym.replay.report``). The comparison runs after the replay run, in the plan's order, so
the report reads in the order the rollouts were asked for.

A fork (``fork_at=K``) is the same run whose replay model hands turns K and after to the live
model the config names (kept beside it as ``<model>_live``): the new rollout is recorded in OUT's
ledger with its parent and K (``rollgym_parent`` on its row), and its first K turns are checked
against the record. The trainer API's ``rollgym.trainer.fork`` is this with one rollout.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from rollgym.collect.launchers import RunAgents, local_launcher
from rollgym.collect.layout import (
    LINE_LIMIT,
    LedgerLine,
    RunDir,
    Tolerance,
    open_run_file,
    raw_lines,
)
from rollgym.collect.orchestrate import run_collection
from rollgym.collect.rundir import RunOutcome
from rollgym.config import Config, ServerConfig, parse_config
from rollgym.errors import ConfigError, root_record
from rollgym.replay.compare import Divergence, first_divergence
from rollgym.replay.model import ReplayModel
from rollgym.replay.plan import (
    INPUT_FILE,
    PLAN_FILE,
    Key,
    key_text,
    line_at,
    select,
    write_plan,
)
from rollgym.replay.report import (
    MISMATCH_LOG,
    REPORT_FILE,
    ReplayReport,
    ReportWriter,
    RolloutReplay,
    environment_change,
    read_entries,
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
    "read_entries",
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
    config: Config, plan: Path, log_path: Path, *, fork: bool = False, keep: int | None = None
) -> tuple[Config, set[str]]:
    """``config`` with each model server its agents call replaced by the replay model serving
    ``plan`` (with ``fork``, the original kept as ``<name>_live`` for the turns past the fork;
    ``keep``: the plan entries it holds at once, the replay's concurrency); and the names
    replaced. A usage error names what the replay cannot stand in for."""
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
            options={"plan": str(plan), "log": str(log_path), "live": live,
                     **({"keep": keep} if keep else {})},
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
    source, output = _check(source, output, fork_at)
    base = config if config is not None else recorded_config(source)
    # A failure's key is all it needs. A line of the ledger that is no record is an error
    # naming it: skipped, its rollout would be missing from the report without a word.
    torn: list[str] = []
    recorded = RecordedRun(
        source, failure_records=False, tolerance=Tolerance.TORN_LAST, warnings=torn
    )
    try:
        keys = [key for key in select(recorded, source, rollouts, sample, seed)
                for _ in range(max(1, copies))]  # fmt: skip
        conc = concurrency or base.collect.concurrency
        cfg, replaced = replay_config(
            base, output / PLAN_FILE, output / MISMATCH_LOG, fork=fork_at is not None,
            keep=conc,
        )  # fmt: skip
        collect = cfg.collect.model_copy(update={"repeats": 1, "limit": None, "concurrency": conc})
        agents = RunAgents.of(cfg, collect)  # checked before anything is written
        launcher = local_launcher(cfg, agents, log_dir=RunDir(output).logs, log_level=log_level)
        write_plan(recorded, keys, output, fork_at, torn)
        for warning in torn:
            log.warning("%s", warning)
        outcome = await run_collection(
            cfg, collect, output / INPUT_FILE, output, launcher, agents=agents,
            progress=progress, agent_dialects=agent_dialects, dialects=dialects,
        )  # fmt: skip
        report = ReplayReport(str(recorded.out_dir), str(output), fork_at=fork_at)
        report.environment = environment_change(source, output, replaced)
        compare_run(recorded, keys, output, report)
    finally:
        recorded.close()
    return outcome, report


def _check(source: Path, output: Path, fork_at: int | None) -> tuple[Path, Path]:
    """Usage errors before anything is written; ``source`` and ``output`` made absolute (the
    replay model runs in a process of its own, and every replayed row names the run it
    replays, ``rollgym_parent.run``: a path relative to where the command was typed could not
    be followed from anywhere else)."""
    if not RunDir(source).tasks.exists():
        raise ConfigError(f"{source}: not a run directory (no tasks.jsonl)")
    if source.resolve() == output.resolve():
        raise ConfigError(f"--output {output}: must differ from the run being replayed")
    if fork_at is not None and fork_at < 0:
        raise ConfigError(f"--fork-at {fork_at}: must be a turn index >= 0")
    if RunDir(output).rollouts.exists():
        raise ConfigError(f"--output {output}: holds a run already; replay into a new directory")
    return source.absolute(), output.resolve()


def compare_run(
    recorded: RecordedRun, keys: list[Key], output: Path, report: ReplayReport
) -> ReplayReport:
    """Each replayed rollout (``i:0`` of ``output``'s ledger replays ``keys[i]``) against its
    recorded one, in order, each entry written to ``output/replay.json`` as it is compared;
    two records held at a time."""
    files = RunDir(output)
    new = _offsets(files.successes(), len(keys))
    failed = _offsets(files.failed(), len(keys))
    noted = _mismatches(output / MISMATCH_LOG)
    report.skipped = sum(1 for key in recorded.failed if key not in recorded.succeeded)
    writer = ReportWriter(report, output / REPORT_FILE)
    try:
        with contextlib.ExitStack() as stack:
            news, fails, notes = (
                stack.enter_context(fh) if (fh := open_run_file(path)) is not None else None
                for path in (files.rollouts, files.failures, output / MISMATCH_LOG)
            )
            for i, key in enumerate(keys):
                got = RolloutReplay(key_text(key), f"{i}:0", "identical", fork_at=report.fork_at)
                got.divergence = _divergence(
                    got, recorded.record(key) or {}, _at(news, new[i]),
                    _at(notes, noted.get(got.replay, -1), ledger=False), _at(fails, failed[i]),
                )  # fmt: skip
                if got.divergence is not None:
                    got.status = "diverged"
                writer.add(got)
    except BaseException:
        writer.abandon()
        raise
    return writer.close()


def _divergence(
    got: RolloutReplay,
    old: dict[str, Any],
    record: dict[str, Any] | None,
    note: dict[str, Any] | None,
    failure: dict[str, Any] | None,
) -> Divergence | None:
    """The entry's divergence: from its new record, else the replay model's note on it, else
    its failure."""
    if record is not None:
        got.reward = record.get("reward")
        return first_divergence(old, record, turns=got.fork_at)
    if note is not None:
        return Divergence(note.get("turn"), "replay model", None, note.get("why"))
    if failure is not None:
        error = root_record(failure.get("error") or {})
        text = f"{error.get('type')}: {error.get('message')}"
        return Divergence(None, "failure", old.get("reward"), text)
    return Divergence(None, "failure", old.get("reward"), "not replayed")


def _offsets(ledger: Iterator[LedgerLine], n: int) -> array[int]:
    """Where rollout ``i:0`` (``i`` < ``n``) starts in a ledger file, ``-1`` where it has
    none: eight bytes a rollout, the last record of a rollout winning."""
    out = array("q", [-1]) * n
    for got in ledger:
        task, rollout = got.key
        if rollout == 0 and task < n:
            out[task] = got.offset
    return out


def _at(fh: BinaryIO | None, offset: int, *, ledger: bool = True) -> dict[str, Any] | None:
    """The JSON object that starts at ``offset`` of ``fh`` (a ledger record, or with
    ``ledger=False`` any line: a note); None for none (``offset`` -1, no file)."""
    if fh is None or offset < 0:
        return None
    if ledger:
        raw = line_at(fh, offset)
    else:
        fh.seek(offset)
        raw = fh.readline(LINE_LIMIT + 1)
    data = orjson.loads(raw) if raw is not None else None
    return data if isinstance(data, dict) else None


def _mismatches(path: Path) -> dict[str, int]:
    """Where the replay model's first note on each rollout starts in its log (a line torn by
    a killed server skipped)."""
    out: dict[str, int] = {}
    fh = open_run_file(path)
    if fh is None:
        return out
    with fh:
        for got in raw_lines(fh):
            if got.raw is None:
                continue
            try:
                note = orjson.loads(got.raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(note, dict) and isinstance(note.get("rollout"), str):
                out.setdefault(note["rollout"], got.offset)
    return out
