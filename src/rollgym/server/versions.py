"""Where a model call's policy version, replica and aborted versions are written, and read.

A rollgym model server stamps every answer (``stamp_response``, ``stamp_completion``); its
agents and records read them back (``call_version``, ``rollout_versions``). The one place that
knows the shape::

    response["rollgym_upstream"] = {           # one model call (a /v1/responses answer)
        "rollgym_policy_version": 3,           # the version it ran under
        "rollgym_replica": 0,                  # the upstream replica that answered
        "rollgym_aborted_versions": [2],       # only if a pause aborted it (re-issued after)
        ...                                    # the upstream's raw token fields, if any
    }

A whole rollout (the agent's final response) carries a list of these, one per model call in
order (``rollgym.agents.response.final_response``). Where the call's last output item carries
token data, the version is put there too (``rollgym_policy_version``), so each trainer sample
says which policy made its tokens (``rollgym.integrations.samples``). None of this needs
``return_token_ids``.
"""

from __future__ import annotations

from typing import Any

from rollgym.server.policy import Ran
from rollgym.wire import ABORTED_VERSIONS, POLICY_VERSION, REPLICA, TOKEN_FIELDS, UPSTREAM_KEY


def _fields(ran: Ran[Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {POLICY_VERSION: ran.version, REPLICA: ran.replica}
    if ran.aborted_versions:
        fields[ABORTED_VERSIONS] = list(ran.aborted_versions)
    return fields


def stamp_response(response: dict[str, Any], ran: Ran[Any]) -> None:
    """Record on a Responses API answer what its call ran under (see the module docstring)."""
    entry = response.get(UPSTREAM_KEY)
    if not isinstance(entry, dict):
        entry = response[UPSTREAM_KEY] = {}
    entry.update(_fields(ran))
    output = response.get("output")
    if isinstance(output, list) and output:
        last = output[-1]
        if isinstance(last, dict) and all(name in last for name in TOKEN_FIELDS):
            last[POLICY_VERSION] = ran.version


def stamp_completion(completion: dict[str, Any], ran: Ran[Any]) -> None:
    """The same on a chat completion: at its top level, beside the upstream's fields."""
    completion.update(_fields(ran))


def _version(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def call_version(response: Any) -> int | None:
    """The policy version one model call's answer says it ran under (None: it does not say,
    e.g. a model server that is not rollgym's)."""
    entry = response.get(UPSTREAM_KEY) if isinstance(response, dict) else None
    return _version(entry.get(POLICY_VERSION)) if isinstance(entry, dict) else None


def rollout_versions(response: Any) -> tuple[int | None, ...]:
    """Each model call's policy version of a rollout's final response, in call order (None
    where unknown): its ``rollgym_upstream`` list, or the one entry of a single call's answer
    returned as it is. Empty when the response carries none."""
    entries = response.get(UPSTREAM_KEY) if isinstance(response, dict) else None
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        return ()
    return tuple(_version(e.get(POLICY_VERSION)) if isinstance(e, dict) else None for e in entries)


class CallVersions:
    """The policy versions a rollout's model calls ran under, as their answers said: the
    oldest is sent with each next call (``x-rollgym-oldest-version``)."""

    __slots__ = ("oldest",)

    def __init__(self) -> None:
        self.oldest: int | None = None

    def saw(self, response: Any) -> None:
        """Count the version of one model call's answer (if it names one)."""
        version = call_version(response)
        if version is not None and (self.oldest is None or version < self.oldest):
            self.oldest = version
