"""``LookupEnv``: the model must call ``lookup`` and answer from what it returns.

The registry (``knowledge.py``) is fictional, so a right answer without a lookup is a guess;
``verify`` pays only an answer that contains the expected value *and* came from a rollout that
called the tool. ``tool_called`` is reported as a metric, and ``aggregate_metrics`` turns it
into the run's tool-call rate.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from rollgym.envs.lookup.knowledge import ENTRIES, canonical_key
from rollgym.errors import InvalidRequest
from rollgym.protocol import output_text
from rollgym.server.resources import ResourcesServer, Session, tool

# "48,213" and "48213" are the same number; commas between digit groups are dropped.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def normalize(text: str) -> str:
    """Casefolded text with thousands separators and runs of whitespace collapsed."""
    return " ".join(_THOUSANDS.sub("", text).split()).casefold()


def contains_answer(text: str, expected: str) -> bool:
    """Whether ``expected`` occurs in ``text`` as a whole token (``482`` is not in ``48213``)."""
    needle = normalize(expected)
    if not needle:
        return False
    pattern = rf"(?<![0-9a-z]){re.escape(needle)}(?![0-9a-z])"
    return re.search(pattern, normalize(text)) is not None


class LookupEnv(ResourcesServer):
    """Questions about the fictional Norrowvale registry, answered with the ``lookup`` tool."""

    row_fields = frozenset({"expected_answer"})

    async def seed_session(self, session: Session) -> None:
        session.data["lookups"] = []

    @tool
    async def lookup(self, session: Session, key: str) -> dict[str, Any]:
        """Look up a Norrowvale registry entry by key: a town name or a product code like QX-4471."""
        # Every call counts as using the tool, found or not; a stateless call has no seed.
        session.data.setdefault("lookups", []).append(key)
        canonical = canonical_key(key)
        if canonical is None:
            close = difflib.get_close_matches(key, ENTRIES, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise InvalidRequest(f"no registry entry for key {key!r}{hint}", status=404)
        return dict(ENTRIES[canonical])

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, float | int]:
        expected = task.get("expected_answer")
        if not isinstance(expected, (str, int, float)) or isinstance(expected, bool):
            raise InvalidRequest(
                "lookup task needs 'expected_answer' (a string or number)", status=422
            )
        called = bool(session.data.get("lookups"))
        correct = contains_answer(output_text(response), str(expected))
        return {"reward": 1.0 if correct and called else 0.0, "tool_called": int(called)}

    async def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        flags = [
            float(r["tool_called"])
            for r in rollouts
            if isinstance(r.get("tool_called"), (int, float))
        ]
        if not flags:
            return {}
        return {"tool_call_rate": sum(flags) / len(flags)}
