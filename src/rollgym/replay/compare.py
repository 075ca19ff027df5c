"""Where a replayed rollout first differs from its record: the seed, each turn's model output
and environment answers in order (tool outputs, observations, a Gymnasium step's reward), then
the reward and the verifier's other fields. A field that measures time or cost differs in every
run and is never compared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollgym.replay.turns import env_value, split_turns
from rollgym.wire import INDEX_FIELDS, PARENT_FIELD

COMPARED_APART = frozenset({"response", "responses_create_params", "reward", "step_rewards"})
"""Fields compared turn by turn or first, not as verifier fields."""

VOLATILE = frozenset(
    {"rollgym_timing", "agent_seconds", "duration_s", "finished_at", "attempts", PARENT_FIELD}
    | INDEX_FIELDS
)
"""Fields of a record that are no measurement of the environment: timing, the ledger's own."""
VOLATILE_PREFIXES = ("rollgym_cost", "rollgym_provenance", "rollgym_fingerprint")
VOLATILE_SUFFIXES = ("_seconds", "_s")


@dataclass(frozen=True)
class Divergence:
    """The first place a replay differs from its record. ``turn``: the model turn whose
    environment answer differs (the turn after the last one for the reward and the verifier's
    fields; ``None`` when unknown); ``field``: ``seed``, ``model output``, ``turns``,
    ``tool output``, ``step reward``, ``reward``, ``verifier field``, ``replay model`` or
    ``failure``; ``key``: the verifier field's name, or the item's position in the turn."""

    turn: int | None
    field: str
    recorded: Any
    replayed: Any
    key: str | int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"turn": self.turn, "field": self.field}
        if self.key is not None:
            out["key"] = self.key
        out["recorded"] = self.recorded
        out["replayed"] = self.replayed
        return out


def _volatile(key: str) -> bool:
    return key in VOLATILE or key.startswith(VOLATILE_PREFIXES) or key.endswith(VOLATILE_SUFFIXES)


def _output(record: dict[str, Any]) -> Any:
    response = record.get("response")
    return response.get("output") if isinstance(response, dict) else None


def _step_rewards(record: dict[str, Any]) -> list[Any] | None:
    rewards = record.get("step_rewards")
    return rewards if isinstance(rewards, list) else None


def first_divergence(
    recorded: dict[str, Any], replayed: dict[str, Any], *, turns: int | None = None
) -> Divergence | None:
    """The first difference of ``replayed`` from ``recorded`` (two verified rollouts), or None.
    ``turns``: compare only the first ``turns`` turns (a fork's replayed prefix), nothing after."""
    if recorded.get("responses_create_params") != replayed.get("responses_create_params"):
        return Divergence(
            0, "seed", recorded.get("responses_create_params"),
            replayed.get("responses_create_params"),
        )  # fmt: skip
    old_prefix, old = split_turns(_output(recorded))
    new_prefix, new = split_turns(_output(replayed))
    if [env_value(i) for i in old_prefix] != [env_value(i) for i in new_prefix]:
        return Divergence(0, "seed", old_prefix, new_prefix)
    old_steps, new_steps = _step_rewards(recorded), _step_rewards(replayed)
    last = max(len(old), len(new)) if turns is None else turns
    for t in range(last):
        if t >= len(old) or t >= len(new):
            return Divergence(t, "turns", len(old), len(new))
        if old[t].model != new[t].model:
            return Divergence(t, "model output", old[t].model, new[t].model)
        found = _env_divergence(t, old[t].env, new[t].env)
        if found is not None:
            return found
        if old_steps is not None and new_steps is not None:
            a = old_steps[t] if t < len(old_steps) else None
            b = new_steps[t] if t < len(new_steps) else None
            if a != b:
                return Divergence(t, "step reward", a, b)
    if turns is not None:
        return None
    if recorded.get("reward") != replayed.get("reward"):
        return Divergence(len(old), "reward", recorded.get("reward"), replayed.get("reward"))
    keys = sorted((set(recorded) | set(replayed)) - COMPARED_APART)
    for key in keys:
        if _volatile(key):
            continue
        if recorded.get(key) != replayed.get(key):
            return Divergence(len(old), "verifier field", recorded.get(key), replayed.get(key), key)
    return None


def _env_divergence(turn: int, old: list[Any], new: list[Any]) -> Divergence | None:
    for position, (a, b) in enumerate(zip(old, new, strict=False)):
        va, vb = env_value(a), env_value(b)
        if va != vb:
            return Divergence(turn, "tool output", _shown(va), _shown(vb), position)
    if len(old) != len(new):
        return Divergence(turn, "tool outputs", len(old), len(new))
    return None


def _shown(value: Any) -> Any:
    """A tool output as its text (what differs is then readable), other items whole."""
    if isinstance(value, dict) and "output" in value:
        return value["output"]
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    return value
