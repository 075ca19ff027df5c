"""The replay's report (``OUT/replay.json``): one entry per replayed rollout, identical or its
first divergence, and whether the environment that replayed differs from the one that recorded
(``run.json``'s ``fingerprints`` when the runs carry them, and the ``code`` every run records).

A replay of hundreds of thousands of rollouts has as many entries, so none is held: each is
written as it is compared (``ReportWriter``, to ``replay.json.part``), the counts are kept, and
at the end ``replay.json`` is written from them, the summary first and the entries streamed
from the part file, one JSON object a line inside ``"rollouts": [...]``. It is one JSON
document, as it always was, and its entries can be read back one at a time
(``read_entries``) without loading it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from rollgym.collect.layout import RunDir, open_run_file
from rollgym.errors import ConfigError
from rollgym.replay.compare import Divergence

REPORT_FILE = "replay.json"
MISMATCH_LOG = "replay_model.jsonl"
"""Where the replay model notes the requests the record could not answer."""
SHOWN = 20
"""The divergences a report keeps in memory (``ReplayReport.shown``), for the terminal."""

_ENTRIES_OPEN = b'  "rollouts": [\n'
_ENTRIES_CLOSE = b"]\n}\n"


@dataclass
class RolloutReplay:
    """One rollout's replay: ``identical``, ``diverged`` (with the first ``divergence``) or
    ``failed`` (the replay failed where the record did not: its error, a divergence too)."""

    rollout: str
    """The recorded rollout (``task_index:rollout_index`` of the source run)."""
    replay: str
    """Its rollout id in the replay's own ledger."""
    status: str
    divergence: Divergence | None = None
    fork_at: int | None = None
    reward: float | None = None
    """The replay's reward (a fork's, the continuation's)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rollout": self.rollout, "replay": self.replay}
        out["status"] = self.status
        if self.fork_at is not None:
            out["fork_at"] = self.fork_at
            out["reward"] = self.reward
        if self.divergence is not None:
            out["divergence"] = self.divergence.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutReplay:
        d = data.get("divergence")
        divergence = None
        if isinstance(d, dict):
            divergence = Divergence(
                d.get("turn"), d.get("field", ""), d.get("recorded"), d.get("replayed"),
                d.get("key"),
            )  # fmt: skip
        return cls(
            data["rollout"], data["replay"], data["status"], divergence,
            data.get("fork_at"), data.get("reward"),
        )  # fmt: skip


@dataclass
class ReplayReport:
    """What a replay found: the counts, the first ``SHOWN`` divergences, and where every
    entry is (``path``: ``replay.json``, read back by ``entries``)."""

    source: str
    output: str
    fork_at: int | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0
    """Rollouts that failed in the source run: there is no output to replay."""
    replayed: int = 0
    identical: int = 0
    diverged: int = 0
    """Entries not identical (diverged or failed): the exit code is 1 when there is one."""
    shown: list[RolloutReplay] = field(default_factory=list)
    """The first ``SHOWN`` entries not identical, in the report's order."""
    path: Path | None = None
    held: list[RolloutReplay] | None = None
    """Every entry, when a caller asked for them in memory (``hold``: a fork's few)."""

    def entries(self) -> Iterator[RolloutReplay]:
        """Every entry, in the plan's order, read from ``replay.json`` one at a time."""
        if self.held is not None:
            yield from self.held
        elif self.path is not None:
            yield from read_entries(self.path)

    def hold(self) -> ReplayReport:
        """This report with its entries read into memory (for a report of a few rollouts that
        outlives its directory: ``rollgym.fork``)."""
        self.held = list(self.entries())
        return self

    def summary(self) -> dict[str, Any]:
        """``replay.json`` without its entries."""
        return {
            "source": self.source,
            "output": self.output,
            "fork_at": self.fork_at,
            "replayed": self.replayed,
            "identical": self.identical,
            "diverged": self.diverged,
            "skipped_failed": self.skipped,
            "environment": self.environment,
        }


class ReportWriter:
    """Writes a report's entries as they are compared, counting them (``add``); ``close``
    writes ``replay.json``. Holds the counts and ``SHOWN`` entries, never the rest."""

    def __init__(self, report: ReplayReport, path: Path) -> None:
        self.report = report
        self.path = path
        self.part = path.with_name(path.name + ".part")
        self._out: BinaryIO = _create(self.part)

    def add(self, entry: RolloutReplay) -> None:
        report = self.report
        report.replayed += 1
        if entry.status == "identical":
            report.identical += 1
        else:
            report.diverged += 1
            if len(report.shown) < SHOWN:
                report.shown.append(entry)
        self._out.write(orjson.dumps(entry.to_dict()) + b"\n")

    def close(self) -> ReplayReport:
        """Write ``replay.json`` (atomically: a reader never sees half of it) from the summary
        and the entries written; return the report."""
        self._out.close()
        head = orjson.dumps(self.report.summary(), option=orjson.OPT_INDENT_2)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with _create(tmp) as out, self.part.open("rb") as entries:
            out.write(head[: head.rindex(b"}")].rstrip() + b",\n" + _ENTRIES_OPEN)
            # Each entry a line; a comma before every one but the first.
            first = True
            for line in entries:
                out.write((b"" if first else b",\n") + line.rstrip(b"\n"))
                first = False
            out.write((b"" if first else b"\n") + _ENTRIES_CLOSE)
        tmp.replace(self.path)
        self.part.unlink()
        self.report.path = self.path
        return self.report

    def abandon(self) -> None:
        """Drop what was written (the replay failed before its report)."""
        self._out.close()
        with contextlib.suppress(FileNotFoundError):
            self.part.unlink()


def _create(path: Path) -> BinaryIO:
    """``path`` created anew for writing, a link left in its place removed, never followed."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return open(os.open(path, flags, 0o644), "wb")


def read_entries(path: Path) -> Iterator[RolloutReplay]:
    """The entries of the report ``ReportWriter`` wrote at ``path``, one line at a time."""
    fh = open_run_file(path)
    if fh is None:
        raise ConfigError(f"{path}: no replay report")
    with fh:
        for line in fh:
            if line == _ENTRIES_OPEN:
                break
        for line in fh:
            if line.startswith(b"]"):
                return
            yield RolloutReplay.from_dict(orjson.loads(line.rstrip(b"\n").removesuffix(b",")))


def environment_change(source: Path, output: Path, replaced: set[str]) -> dict[str, Any]:
    """Whether the environment that replayed differs from the one that recorded: by the runs'
    ``fingerprints`` (when both carry them; ``"unknown"`` otherwise) and by the ``code`` each
    run records per server (``replaced``: the model servers the replay stood in for)."""
    one, two = RunDir(source), RunDir(output)
    before, after = one.read_json(one.run_json.name), two.read_json(two.run_json.name)
    out: dict[str, Any] = {}
    fa, fb = before.get("fingerprints"), after.get("fingerprints")
    if isinstance(fa, dict) and isinstance(fb, dict):
        # Known on both sides only: an unknown one (a replica that did not answer in time, a
        # foreign server) differs from anything by its reason alone, which is no evidence.
        changed = {
            name: _parts(fa[name], fb[name])
            for name in sorted(fa.keys() & fb.keys())
            if _known(fa[name]) and _known(fb[name]) and fa[name] != fb[name]
        }
        # A server fingerprinted in one run only, or unknown (a foreign server: id null) in
        # either, is no evidence of "same".
        open_ = sorted(
            (fa.keys() ^ fb.keys())
            | {n for n in fa.keys() & fb.keys() if not _known(fa[n]) or not _known(fb[n])}
        )
        out["fingerprints"] = "differ" if changed else "unknown" if open_ else "same"
        if changed:
            out["fingerprint_changes"] = changed
        if open_:
            out["fingerprints_unknown"] = open_
    else:
        out["fingerprints"] = (
            "unknown" if not isinstance(fa, dict) else "not recorded by the replay"
        )
    ca, cb = before.get("code"), after.get("code")
    if isinstance(ca, dict) and isinstance(cb, dict):
        code = [
            f"{name}: {ca[name].get('file')} sha256 {str(ca[name].get('sha256'))[:12]} -> "
            f"{str(cb[name].get('sha256'))[:12]}"
            for name in sorted((ca.keys() & cb.keys()) - replaced)
            if isinstance(ca[name], dict) and isinstance(cb[name], dict)
            and ca[name].get("sha256") != cb[name].get("sha256")
        ]  # fmt: skip
        out["code"] = "differs" if code else "same"
        if code:
            out["code_changes"] = code
    out["differs"] = out.get("fingerprints") == "differ" or out.get("code") == "differs"
    return out


def _parts(a: Any, b: Any) -> list[str]:
    """The parts of two fingerprints that differ (``code``, ``data``, ``version``, ...)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return ["differs"]
    names = []
    for part in sorted(a.keys() | b.keys()):
        one, two = a.get(part), b.get(part)
        if isinstance(one, dict) and isinstance(two, dict):
            if one.get("digest", one) != two.get("digest", two):
                names.append(part)
        elif one != two and part != "id":
            names.append(part)
    return names or ["differs"]


def _known(fingerprint: Any) -> bool:
    return isinstance(fingerprint, dict) and bool(fingerprint.get("id"))
