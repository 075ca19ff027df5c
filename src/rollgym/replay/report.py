"""The replay's report (``OUT/replay.json``): one entry per replayed rollout, identical or its
first divergence, and whether the environment that replayed differs from the one that recorded
(``run.json``'s ``fingerprints`` when the runs carry them, and the ``code`` every run records)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollgym.collect.layout import RunDir
from rollgym.replay.compare import Divergence

REPORT_FILE = "replay.json"
MISMATCH_LOG = "replay_model.jsonl"
"""Where the replay model notes the requests the record could not answer."""


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


@dataclass
class ReplayReport:
    source: str
    output: str
    rollouts: list[RolloutReplay] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    fork_at: int | None = None
    skipped: int = 0
    """Rollouts that failed in the source run: there is no output to replay."""

    @property
    def identical(self) -> int:
        return sum(r.status == "identical" for r in self.rollouts)

    @property
    def diverged(self) -> list[RolloutReplay]:
        return [r for r in self.rollouts if r.status != "identical"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "output": self.output,
            "fork_at": self.fork_at,
            "replayed": len(self.rollouts),
            "identical": self.identical,
            "diverged": len(self.diverged),
            "skipped_failed": self.skipped,
            "environment": self.environment,
            "rollouts": [r.to_dict() for r in self.rollouts],
        }


def environment_change(source: Path, output: Path, replaced: set[str]) -> dict[str, Any]:
    """Whether the environment that replayed differs from the one that recorded: by the runs'
    ``fingerprints`` (when both carry them; ``"unknown"`` otherwise) and by the ``code`` each
    run records per server (``replaced``: the model servers the replay stood in for)."""
    one, two = RunDir(source), RunDir(output)
    before, after = one.read_json(one.run_json.name), two.read_json(two.run_json.name)
    out: dict[str, Any] = {}
    fa, fb = before.get("fingerprints"), after.get("fingerprints")
    if isinstance(fa, dict) and isinstance(fb, dict):
        changed = {
            name: _parts(fa[name], fb[name])
            for name in sorted(fa.keys() & fb.keys())
            if fa[name] != fb[name]
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
