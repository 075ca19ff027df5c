"""What a failure of the stack's model looks like to a caller of the agent: the agent's 502
carrying the model's error as its origin, and trainer groups made of such failures only."""

from __future__ import annotations

from rollgym.errors import HTTPStatusError, RollgymError
from rollgym.trainer import FailedRollout, TaskGroup

from .servers import FAULT_MESSAGE


def assert_model_failure(err: RollgymError, status: int = 500) -> None:
    """``err`` is the agent's 502 for a ``FaultyModel`` that answered ``status`` to all three
    attempts of a call, carried as its origin, every field in place."""
    assert isinstance(err, HTTPStatusError), repr(err)
    assert (err.status, err.server, err.endpoint) == (502, "agent", "/run")
    # The agent's body is kept without the origin it carried (a record keeps each fact once);
    # the model's fault reads in the origin, and in the whole story.
    assert err.body is not None and "origin" not in err.body
    assert FAULT_MESSAGE in str(err)
    assert err.retryable is False
    root = err.root()
    assert isinstance(root, HTTPStatusError), repr(root)
    assert (root.status, root.server, root.endpoint, root.attempts) == (
        status, "model", "/v1/responses", 3,
    )  # fmt: skip


def assert_failed_groups(groups: list[TaskGroup], tasks: int, repeats: int, status: int) -> None:
    """``tasks`` groups in order, each of ``repeats`` rollouts that failed as above."""
    assert [g.task_index for g in groups] == list(range(tasks))
    for group in groups:
        assert [r.rollout_index for r in group.rollouts] == list(range(repeats))
        assert group.rewards == [] and not group.complete
        for record in group.rollouts:
            assert isinstance(record, FailedRollout)
            assert_model_failure(record.error, status)
