"""The replay model: a model server that answers each agent request with the model output
recorded for that rollout and turn (``impl: rollgym.replay.model:ReplayModel``).

``rollgym replay`` puts it in place of the model server its agents call, so the real agents and
environments of the run's config run again while the model's side comes from the record. A
request is matched to its recorded rollout by the rollout id every rollgym agent sends
(``x-rollgym-rollout``, or the ``/ng-rollout/<id>/`` path; NeMo Gym 0.7's episodes spell it
``<task>-<rollout>[-a<attempt>]``) and the replay's plan
(``rollgym.replay.plan``), and to its turn by what its ``input`` already holds: the served items
come back in the next request with their ids, so the turn is one past the last recorded turn
whose items it carries (an agent that drops the ids: the model turns its input holds beyond the
task's own prompt). Retries, concurrency and agents that rebuild the input all read the same.

A request the record cannot answer (no rollout id, a rollout not in the plan, a turn past the
recorded ones) is answered 409 at once, never left waiting, and noted in ``log`` (one JSON line:
rollout, parent, turn, why): the replay's report names it as that rollout's divergence. With
``fork_at`` in a rollout's plan entry, turns from there on go to the ``live`` model server.

Its memory is bounded by the replay's concurrency, not the run's size: the plan is indexed by
offset (``PlanFile``) and a rollout's entry is read from it at the rollout's first request, then
kept among the ``keep`` most recently asked for (the replay sets ``keep`` to its concurrency, so
every rollout in flight stays kept and each entry is read about once). A rollout that finished
is dropped when newer ones push it out; one dropped too soon is read again, never answered
wrong. This needs nothing from the collector (no registration per rollout, no "done" message
that a killed rollout would never send), which is why it was chosen over registering entries
as rollouts are dispatched.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field
from starlette.routing import BaseRoute

from rollgym.errors import ConfigError, InvalidRequest
from rollgym.replay.plan import PlanEntry, PlanFile
from rollgym.replay.turns import model_turns
from rollgym.server.base import ModelPeer, ServerContext
from rollgym.server.endpoint import Call
from rollgym.server.model import RESPONSES_ENDPOINT, ModelServer, model_list, openai_routes
from rollgym.wire import HEADER_ROLLOUT

_DIALECT_ID = re.compile(r"(\d+)-(\d+)(?:-a\d+)?")

MISMATCH_STATUS = 409
"""The answer to a request the record cannot answer: a conflict with the record, never retried
(4xx), so the rollout ends at once with the replay model's error as its cause."""


class _Served:
    """One plan entry, indexed: the turn of every recorded model item id."""

    __slots__ = ("entry", "turn_of")

    def __init__(self, entry: PlanEntry) -> None:
        self.entry = entry
        turns: dict[str, set[int]] = {}
        for turn, items in enumerate(entry.turns):
            for item in items:
                for key in ("id", "call_id"):
                    value = item.get(key) if isinstance(item, dict) else None
                    if isinstance(value, str) and value:
                        turns.setdefault(value, set()).add(turn)
        # An id a model gave in two turns (parsers that number calls call_0, call_1 in every
        # turn) says nothing about the turn: only ids of one turn are kept.
        self.turn_of = {v: next(iter(t)) for v, t in turns.items() if len(t) == 1}

    def turn(self, items: list[Any]) -> int:
        """The turn a request whose input is ``items`` asks for."""
        last = -1
        for item in items:
            if not isinstance(item, dict):
                continue
            for key in ("id", "call_id"):
                value = item.get(key)
                if isinstance(value, str) and (turn := self.turn_of.get(value)) is not None:
                    last = max(last, turn)
        if last >= 0:
            return last + 1
        return max(0, model_turns(items) - self.entry.prompt_turns)


class ReplayModel(ModelServer):
    """Options: ``plan`` (the replay's ``replay_plan.jsonl``), ``log`` (where requests the
    record cannot answer are noted), ``live`` (the model server that answers past a rollout's
    ``fork_at``), ``keep`` (the plan entries held at once)."""

    own_upstream = True

    class Options(ModelServer.Options):
        plan: Path = Field(description="the replay's plan (rollgym.replay.plan)")
        log: Path | None = Field(default=None, description="JSON lines: requests not answered")
        live: ModelPeer | None = Field(default=None, description="the model past fork_at")
        keep: int = Field(
            default=64, ge=1, le=1 << 20,
            description="plan entries held at once (the replay's concurrency); others are "
            "read from the plan again when asked for",
        )  # fmt: skip

    options: Options

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        self.plan = PlanFile(self.options.plan)
        self.kept: OrderedDict[str, _Served] = OrderedDict()
        """The entries of the rollouts asked for last (at most ``keep``), oldest first."""
        self._kept_lock = threading.Lock()  # entries are read in threads (``respond``)
        self._log_lock = threading.Lock()

    def routes(self) -> list[BaseRoute]:
        return [*super().routes(), *openai_routes(self.policy, self._chat, self._models, self._no)]

    async def _models(self, body: Any, call: Call) -> Any:
        return model_list("rollgym-replay")

    async def _chat(self, body: Any, call: Call) -> Any:
        # Every rollgym agent calls /v1/responses; a record holds Responses API items only.
        self._note(
            call.rollout,
            None,
            None,
            "chat completions asked: the record holds Responses API output",
        )
        raise InvalidRequest("the replay model answers /v1/responses only", status=MISMATCH_STATUS)

    async def _no(self, body: Any, call: Call) -> Any:
        raise InvalidRequest("the replay model has no tokenizer", status=404)

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        rollout = call.rollout
        served = self._kept_entry(rollout)
        if served is None:  # not held: read from the plan, off the event loop
            served = await asyncio.to_thread(self._served, rollout)
        if served is None:
            why = (
                "the request names no rollout (x-rollgym-rollout)" if not rollout
                else f"rollout {rollout!r} is not in the replay's plan"
            )  # fmt: skip
            self._note(rollout, None, None, why)
            raise InvalidRequest(f"replay: {why}", status=MISMATCH_STATUS)
        raw = params.get("input")
        items = raw if isinstance(raw, list) else [{"role": "user", "content": raw}]
        entry = served.entry
        turn = served.turn(items)
        if entry.fork_at is not None and turn >= entry.fork_at:
            return await self._live(params, rollout or "")
        if turn >= len(entry.turns):
            why = f"asked for turn {turn}; the record has {len(entry.turns)} model turns"
            self._note(rollout, entry.parent, turn, why)
            raise InvalidRequest(f"replay: rollout {entry.parent} {why}", status=MISMATCH_STATUS)
        return {
            **entry.shell,
            "id": f"resp_replay_{os.urandom(8).hex()}",
            "output": copy.deepcopy(entry.turns[turn]),
        }

    def _served(self, rollout: str | None) -> _Served | None:
        """Rollout ``rollout``'s plan entry: held, else read from the plan and held (the
        oldest held one dropped past ``keep``); None if the plan has none."""
        served = self._kept_entry(rollout)
        key = _plan_id(rollout)
        if served is not None or key is None:
            return served
        entry = self.plan.entry(key)
        if entry is None:
            return None
        with self._kept_lock:
            # Another thread may have read it meanwhile: one entry held per rollout.
            served = self.kept.setdefault(key, _Served(entry))
            self.kept.move_to_end(key)
            while len(self.kept) > self.options.keep:
                self.kept.popitem(last=False)
        return served

    def _kept_entry(self, rollout: str | None) -> _Served | None:
        """Rollout ``rollout``'s entry if it is held (no file read: on the event loop)."""
        key = _plan_id(rollout)
        if key is None:
            return None
        with self._kept_lock:
            served = self.kept.get(key)
            if served is not None:
                self.kept.move_to_end(key)
        return served

    async def _live(self, params: dict[str, Any], rollout: str) -> dict[str, Any]:
        if self.options.live is None:
            raise ConfigError(f"server {self.name!r}: a plan with fork_at needs option 'live'")
        answer = await self.client.call(
            self.peer(self.options.live), RESPONSES_ENDPOINT, params,
            headers={HEADER_ROLLOUT: rollout},
        )  # fmt: skip
        if not isinstance(answer, dict):
            raise InvalidRequest("the live model answered no JSON object", status=502)
        return answer

    def _note(self, rollout: str | None, parent: str | None, turn: int | None, why: str) -> None:
        if self.options.log is None:
            return
        line = orjson.dumps({"rollout": rollout, "parent": parent, "turn": turn, "why": why})
        with self._log_lock, self.options.log.open("ab") as fh:
            fh.write(line + b"\n")


def _plan_id(rollout: str | None) -> str | None:
    """The plan's id of the rollout a request names: ``i:0``, or NeMo Gym 0.7's spelling of an
    episode, ``<task>-<rollout>[-a<attempt>]``."""
    if not rollout:
        return None
    if (found := _DIALECT_ID.fullmatch(rollout)) is not None:
        return f"{found[1]}:{found[2]}"
    return rollout
