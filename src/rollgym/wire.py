"""The wire vocabulary: every header, cookie, reserved endpoint and NeMo Gym field name that
rollgym's servers, agents and collector exchange by name, defined once.

It imports nothing, so every layer (``http/``, ``server/``, ``collect/``, the environments, the
tests) can use it without depending on another layer. The shapes behind the names (task rows,
verify results) are ``rollgym.protocol``'s.
"""

from __future__ import annotations

# -- headers and cookies ----------------------------------------------------------------------

HEADER_ROLLOUT = "x-rollgym-rollout"
"""Header carrying ``task_index:rollout_index`` on every call made for one rollout."""

SESSION_HEADER = "x-rollgym-session"
"""Header carrying a resources server's session id (from ``/seed_session`` or ``/reset``)."""

SESSION_COOKIE = "rollgym_session"
"""The cookie carrying the same session id, set on every answer within a session: NeMo Gym's
agents carry cookies only (and keep just those of the latest answer). The header wins when a
call sends both."""

# -- endpoints --------------------------------------------------------------------------------

RESERVED_ENDPOINTS = frozenset(
    {"seed_session", "verify", "aggregate_metrics", "tools", "health", "stats"}
)
"""Endpoints of a resources server that are never tools: a tool may not be named like one,
and an agent never calls one for a model, whatever it asks for."""

# -- NeMo Gym's field names -------------------------------------------------------------------

NG_TASK_INDEX = "_ng_task_index"
NG_ROLLOUT_INDEX = "_ng_rollout_index"
INDEX_FIELDS = frozenset({"task_index", "rollout_index", NG_TASK_INDEX, NG_ROLLOUT_INDEX})
"""A rollout's indices, in rollgym's and NeMo Gym's spelling: never metrics."""


def session_cookie(session_id: str) -> str:
    """The ``set-cookie`` value that carries ``session_id``."""
    return f"{SESSION_COOKIE}={session_id}; Path=/; HttpOnly; SameSite=lax"


__all__ = [
    "HEADER_ROLLOUT",
    "INDEX_FIELDS",
    "NG_ROLLOUT_INDEX",
    "NG_TASK_INDEX",
    "RESERVED_ENDPOINTS",
    "SESSION_COOKIE",
    "SESSION_HEADER",
    "session_cookie",
]
