"""The run directory of a stream (``RolloutStream(output=DIR)``): the collector's files, written
as rollouts are dispatched and recorded, for a run whose rows keep arriving.

    DIR/tasks.jsonl      one line per dispatched rollout (its stamped row), when it is sent;
                         a re-run (of a failed or stale rollout) is a new line, with a fresh
                         ``rollout_index`` (``repeats`` and up), never a second one of the same
    DIR/rollouts.jsonl   one line per scored rollout
    DIR/failures.jsonl   one line per failed rollout (re-run or not)
    DIR/stale.jsonl      one line per stale rollout (cancelled in flight, discarded on arrival,
                         or found too old as its group left for the trainer): an outcome, not
                         a failure
    DIR/run.json         the stream's counts, how it ended, (aborted) why, and the
                         fingerprint of the environment that scored it (``fingerprints``:
                         asked of the agent, which answers its resources server's)

Every line of the three record files names that fingerprint by its id
(``rollgym_fingerprint``), as a run's lines do (``rollgym.collect.provenance``).

A group's records are written when it leaves the stream (yielded to the trainer, or dropped),
judged for good: a rollout that waited in the buffer while the version moved on is written
once, as what it finally was.
The ledger invariant holds as for a run: after a stream that ended (``status: completed``),
every ``(task_index, rollout_index)`` of ``tasks.jsonl`` has exactly one record in the other
three files. A stream stopped early (``closed`` or ``aborted``) leaves the rollouts of the groups it had
not handed over with no record; ``run.json`` counts them (``unfinished``). A stream's run directory is
not resumable: its rows came from a source the stream cannot read again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from rollgym.collect.failure_budget import is_stale
from rollgym.collect.layout import FAILURES, ROLLOUTS, RUN_JSON, STALE, TASKS
from rollgym.collect.records import FailedRollout, RolloutItem, RolloutRecord
from rollgym.collect.rundir import now, write_json
from rollgym.errors import ConfigError
from rollgym.wire import FINGERPRINT_FIELD


class StreamLedger:
    """Appends a stream's dispatched rollouts and records to ``out_dir``."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.started = now()
        self._files: dict[str, IO[bytes]] = {}
        self.records = 0
        self.fingerprints: dict[str, dict[str, Any]] = {}
        """Agent name -> the fingerprint of what scores its rollouts (``run.json``)."""
        self._stamp: dict[str, Any] | None = None

    def scored_by(self, agent: str, fingerprint: dict[str, Any]) -> None:
        """Record the fingerprint of ``agent``'s environment; lines written from now on name
        its id (an unknown one: none, and ``run.json`` says why)."""
        self.fingerprints[agent] = fingerprint
        found = fingerprint.get("id")
        self._stamp = {FINGERPRINT_FIELD: found} if isinstance(found, str) else None

    def open(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # ``lexists``: a link, even one to nothing yet, is taken too; and each file is made
        # anew (``O_EXCL | O_NOFOLLOW``), so no link planted since is written through.
        names = (TASKS, ROLLOUTS, FAILURES, STALE)
        taken = [n for n in names if os.path.lexists(self.out_dir / n)]
        if taken:
            raise ConfigError(
                f"{self.out_dir}: already holds a run ({', '.join(taken)}); a stream writes a "
                "new run directory (it cannot resume: its rows are not kept)"
            )
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for name in names:
            self._files[name] = os.fdopen(os.open(self.out_dir / name, flags, 0o644), "ab")

    def dispatched(self, item: RolloutItem) -> None:
        self._write(TASKS, item.row)

    def add(self, record: RolloutRecord) -> None:
        self.records += 1
        if isinstance(record, FailedRollout):
            line = record.to_json(self._stamp)
            self._write(STALE if is_stale(record.error) else FAILURES, line)
        else:
            self._write(ROLLOUTS, record.to_json(self._stamp))

    def _write(self, name: str, line: bytes) -> None:
        fh = self._files[name]
        fh.write(line + b"\n")
        fh.flush()  # a killed trainer keeps every record written so far

    def close(self, status: str, counts: dict[str, Any], reason: str | None = None) -> None:
        for fh in self._files.values():
            if not fh.closed:
                fh.flush()
                os.fsync(fh.fileno())
                fh.close()
        info: dict[str, Any] = {
            "kind": "stream", "status": status, "started_at": self.started,
            "ended_at": now(), "counts": counts,
        }  # fmt: skip
        if reason is not None:
            info["abort_reason"] = reason
        if self.fingerprints:
            info["fingerprints"] = self.fingerprints
        write_json(self.out_dir / RUN_JSON, info)
