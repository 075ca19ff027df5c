"""NeMo Gym 0.7's failure vocabulary for rollgym's errors (STUB: the API others call; filled in
by the failure-vocabulary work).

    failure_kind(err)           one of FAILURE_KINDS for a rollgym error
    delivery(err)               not_sent | possibly_delivered | delivered
    episode_failure(err, stage) 0.7's EpisodeFailure JSON for an error
    error_from_failure(...)     0.7's EpisodeFailure JSON -> a typed rollgym error
    sidecar_fields(err)         the _ng_failure_* fields of 0.7's sidecar failure rows
"""

from __future__ import annotations

from typing import Any, Literal

from rollgym.errors import RollgymError

Delivery = Literal["not_sent", "possibly_delivered", "delivered"]
Stage = Literal["admission", "seed", "agent", "verification", "cleanup"]


def failure_kind(err: RollgymError) -> str:
    raise NotImplementedError


def delivery(err: RollgymError) -> Delivery:
    raise NotImplementedError


def episode_failure(err: RollgymError, stage: Stage | None = None) -> dict[str, Any]:
    raise NotImplementedError


def error_from_failure(
    failure: dict[str, Any], *, server: str | None = None, endpoint: str | None = None
) -> RollgymError:
    raise NotImplementedError


def sidecar_fields(err: RollgymError) -> dict[str, Any]:
    raise NotImplementedError
