"""Row dialects: the shapes of task row a run speaks, each one small object.

The collector reads a task file, routes each row to a server, sends every attempt of a rollout
and records its end; a dialect says how for its own rows, so the core never asks which shape it
runs. The flat row is built in (``FLAT``: ``/run`` takes the stamped row as it is and answers a
verify response); every other shape is a folder of its own that implements ``RowDialect``. Only
entry points list them (``rollgym.dialects``) and pass the list down to ``prepare_run``, the
``Collector`` and ``RolloutRunner``; given none, they speak the flat row only.

    check(row, route, where)    preparing a run: the row's route and the fields it gives its
                                server, or None when the row is another dialect's
    item(...)                   a rollout of a stamped row of tasks.jsonl as its work item
    exchange(item)              how each attempt is sent and its answer read, and the fields a
                                failure's line carries beside rollgym's
    foreign(err, answer, ...)   any row's failure, read as this dialect's server meant it (a
                                server of the dialect given flat rows answers in its own terms)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from rollgym.collect.records import RolloutItem
from rollgym.collect.route import BY_AGENT, AgentRoute
from rollgym.errors import ConfigError, InputError, RollgymError
from rollgym.protocol import TaskRow, check_verified

AGENT_REF = "agent_ref"


def reason(exc: ValidationError) -> str:
    """A row's first validation error, in a few words (``where: reason`` is the refusal)."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "row"
    if err["type"] == "missing":
        return f"missing required field '{key}'"
    return f"{key}: {err['msg']}"


@dataclass(frozen=True, slots=True)
class RowCheck:
    """What preparing a run learns of one row: how it is routed (``AgentRoute.server``'s
    ``by`` and ``name``: ``agent_ref`` and the name it gives, or None), the top-level fields
    its server is given (warned about when no server reads them) and the per-rollout fields
    ``tasks.jsonl`` leaves out (the run makes its own)."""

    by: str
    name: str | None
    fields: frozenset[str]
    restamp: frozenset[str] = frozenset()


class Exchange(Protocol):
    """The attempts of one rollout, as its dialect sends and reads them."""

    @property
    def server_retries(self) -> bool:
        """The server's retry policy runs the attempts: up to its ``max_attempts`` (at least
        the run's), with its backoff between them."""

    def request(self, attempt: int) -> bytes:
        """The body of ``POST /run`` for attempt ``attempt`` (1 first)."""

    def read(self, answer: Any, attempt: int, server: str) -> dict[str, Any]:
        """The verified record of an answer; a ``RollgymError`` for a failure it reports."""

    def fields(self, err: RollgymError) -> dict[str, Any] | None:
        """The fields a failure's line in ``failures.jsonl`` carries beside rollgym's."""


class RowDialect(Protocol):
    """A task row shape: how its rows are checked, run and recorded (module docstring)."""

    @property
    def name(self) -> str:
        """Names it on its work items (``RolloutItem.dialect``): unique in a list."""

    @property
    def marker(self) -> bytes:
        """Bytes every line of its rows holds: no other line is parsed to ask it (most rows
        are flat)."""

    def check(self, row: dict[str, Any], route: AgentRoute | None, where: str) -> RowCheck | None:
        """None when ``row`` is not this dialect's; else its check, ``InputError`` naming
        ``where`` for a row its server could not run (without ``route``: the row alone)."""

    def item(
        self, task_index: int, rollout_index: int, raw: bytes, row: dict[str, Any],
        route: AgentRoute, prior: int,
    ) -> RolloutItem | None:  # fmt: skip
        """None when the stamped ``row`` is not this dialect's; else the work item of one
        rollout of it (``raw``: its line of ``tasks.jsonl``), routed by ``route``."""

    def exchange(self, item: RolloutItem) -> Exchange:
        """How the attempts of one of its work items are sent and read."""

    def foreign(self, err: RollgymError, answer: Any, server: str) -> RollgymError | None:
        """What any row's failure ``err`` (``answer``: the answer it read, if one came) means
        when ``server`` is one of this dialect's, given a row it does not take; else None."""


@dataclass(frozen=True, slots=True)
class FlatExchange:
    """A flat row's attempts: the stamped row as it is, a verify response back."""

    row: bytes
    server_retries: bool = False

    def request(self, attempt: int) -> bytes:
        return self.row

    def read(self, answer: Any, attempt: int, server: str) -> dict[str, Any]:
        return check_verified(answer, server)

    def fields(self, err: RollgymError) -> dict[str, Any] | None:
        return None


class FlatRows:
    """The built-in dialect: every row no other dialect claims (``marker`` is empty)."""

    name = ""
    marker = b""

    def check(self, row: dict[str, Any], route: AgentRoute | None, where: str) -> RowCheck:
        try:
            TaskRow.model_validate(row)
        except ValidationError as exc:
            raise InputError(f"{where}: {reason(exc)}") from None
        ref = row.get(AGENT_REF)
        name = ref.get("name") if isinstance(ref, dict) else None
        return RowCheck(BY_AGENT, name, frozenset(row))

    def item(
        self, task_index: int, rollout_index: int, raw: bytes, row: dict[str, Any] | None,
        route: AgentRoute, prior: int,
    ) -> RolloutItem:  # fmt: skip
        # Cheap checks first: most runs route every row alike, most rows name no agent
        # (``row``: None when no one parsed the line yet).
        agent = route.default
        if not route.override and b'"agent_ref"' in raw:
            ref = (orjson.loads(raw) if row is None else row).get(AGENT_REF)
            # Every name was checked when the run was prepared.
            agent = route.agent_for(ref.get("name") if isinstance(ref, dict) else None) or agent
        if agent is None:  # refused when the run was prepared: the file changed since
            raise ConfigError("a task row names no agent, and the run has no default agent")
        return RolloutItem(task_index, rollout_index, raw, agent, prior)

    def exchange(self, item: RolloutItem) -> Exchange:
        return FlatExchange(item.row)

    def foreign(self, err: RollgymError, answer: Any, server: str) -> RollgymError | None:
        return None


FLAT = FlatRows()


class Dialects:
    """The dialects a run speaks (``FLAT`` last, always), found by name or by row."""

    def __init__(self, listed: Iterable[RowDialect] = ()) -> None:
        self.others: tuple[RowDialect, ...] = tuple(d for d in listed if d.name != FLAT.name)
        self.all: tuple[RowDialect, ...] = (*self.others, FLAT)
        self._named = {d.name: d for d in self.all}
        if len(self._named) != len(self.all):
            raise ValueError(f"two row dialects share a name: {[d.name for d in self.all]}")

    def named(self, name: str) -> RowDialect:
        """The dialect of a work item (a name no dialect of the list has is a bug: KeyError)."""
        return self._named[name]

    def item(
        self, task_index: int, rollout_index: int, raw: bytes, route: AgentRoute, prior: int
    ) -> RolloutItem:
        """The work item of one rollout of the stamped row ``raw`` (its dialect's)."""
        row = None
        for dialect in self.others:
            if dialect.marker in raw:
                row = orjson.loads(raw) if row is None else row
                got = dialect.item(task_index, rollout_index, raw, row, route, prior)
                if got is not None:
                    return got
        return FLAT.item(task_index, rollout_index, raw, row, route, prior)

    def claimed(self, row: dict[str, Any]) -> bool:
        """Whether another dialect than the flat row's claims ``row``."""
        return any(d.check(row, None, "") is not None for d in self.others)

    def check(self, row: dict[str, Any], route: AgentRoute | None, where: str) -> RowCheck:
        """The check of the first dialect that claims ``row`` (the flat row's, if none)."""
        for dialect in self.others:
            got = dialect.check(row, route, where)
            if got is not None:
                return got
        return FLAT.check(row, route, where)

    def foreign(self, err: RollgymError, answer: Any, server: str) -> RollgymError:
        """``err`` as a dialect's server meant it, if one says so; else ``err``."""
        for dialect in self.others:
            meant = dialect.foreign(err, answer, server)
            if meant is not None:
                return meant
        return err


__all__ = ["FLAT", "Dialects", "Exchange", "FlatExchange", "FlatRows", "RowCheck", "RowDialect"]
