"""NeMo Gym 0.7's wire names that only this dialect (and NeMo RL's integration) exchange.

The names the core also speaks (rollout ids and their path prefix, a failure's
``failure_kind`` / ``stage`` / ``terminal``, ``mask_sample``, the ``_ng_*`` indices) stay in
``rollgym.wire``.
"""

from __future__ import annotations

# -- episodes: the Environment Server protocol -------------------------------------------------
# ``POST /run`` takes
# ``{episode_id: {rollout_id, attempt}, task: {task_id: {taskset, task_id}, task_input}}`` and
# answers ``{episode_id, task_id, result | failure}``.

EPISODE_ID = "episode_id"
ROLLOUT_ID = "rollout_id"
ATTEMPT = "attempt"
TASK = "task"
TASK_ID = "task_id"
TASKSET = "taskset"
TASK_INPUT = "task_input"
TASK_DATA = "task_data"
"""In a ``single_agent_turn`` task input: the environment's fields (a task input's flat fields
other than ``responses_create_params`` move into it)."""
RESULT = "result"
FAILURE = "failure"
FAILURE_REASON = "failure_reason"
DELIVERY = "delivery"
"""Whether the failed request reached the server: ``not_sent``, ``possibly_delivered`` or
``delivered`` (``RolloutFailure.delivery``)."""

AGENT_OWN_FIELDS = ("num_steps", "truncated", "agent_seconds", "drifted_turns")
"""The numbers rollgym's agents add to a verify response (not the environment's metrics)."""
NG_ROLLGYM_AGENT = "_rollgym_agent"
"""Where an episode's result carries ``AGENT_OWN_FIELDS``: 0.7 aggregates every numeric
top-level field of a result but none whose name starts with ``_``."""

# -- sessions ------------------------------------------------------------------------------------

AGENT_SESSIONS_ENDPOINT = "/v1/agent_sessions"
AGENT_SESSIONS_CLOSE_ENDPOINT = "/v1/agent_sessions/close"
RESOURCES_SESSION_ID = "resources_session_id"
AGENT_SESSION_ID = "agent_session_id"
AGENT_SESSION_COOKIE = "rollgym_agent_session"
"""The cookie carrying an agent session's id (base64url, so any id is a valid cookie value)."""
RESOURCES_TOOLS = "resources_tools"
SANDBOX_ACCESS = "sandbox_access"
"""Fields of a seed answer."""
DIRECT_HTTP = "direct_http"
MCP = "mcp"
"""Tool-access kinds."""
AGENT_OBSERVATIONS = "agent_observations"
RESOURCES_COOKIES = "resources_cookies"
"""A close answer: the agent's observations (rollgym's: none) and the granted session's cookie
jar as the turn left it."""

# -- record fields -------------------------------------------------------------------------------

NG_TASK_ID = "_ng_task_id"
"""A record's ``{taskset, task_id}``, beside its indices."""
NG_ROLLOUT_ID = "_ng_rollout_id"
NG_ATTEMPT_INDEX = "_ng_attempt_index"
NG_ENVIRONMENT_SERVER = "_ng_environment_server"
NG_RESULT_TYPE = "_ng_result_type"

NG_FAILURE_CLASS = "_ng_failure_class"
NG_FAILURE_TERMINAL = "_ng_failure_terminal"
NG_FAILURE_MESSAGE = "_ng_failure_message"
NG_FAILURE_STAGE = "_ng_failure_stage"
NG_FAILURE_PARTIAL_RESPONSE = "_ng_failure_partial_response"
NG_FAILURE_TYPE = "_ng_failure_type"
NG_FAILURE_HTTP_STATUS = "_ng_failure_http_status"
NG_FAILURE_RESPONSE_BODY = "_ng_failure_response_body"
"""The fields of a sidecar failure row (``<stem>_failures.jsonl``)."""

# -- NeMo RL's results -------------------------------------------------------------------------

INSTANCE_CONFIG = "instance_config"
"""Where NeMo RL reads ``mask_sample``."""
NG_NO_PERSIST = "_ng_no_persist"
"""The marker of a result never written."""
NG_DISPATCH_DRAINED = "_ng_dispatch_drained"
"""The marker of a row its dispatch budget never started."""

__all__ = [
    "AGENT_OBSERVATIONS",
    "AGENT_OWN_FIELDS",
    "AGENT_SESSIONS_CLOSE_ENDPOINT",
    "AGENT_SESSIONS_ENDPOINT",
    "AGENT_SESSION_COOKIE",
    "AGENT_SESSION_ID",
    "ATTEMPT",
    "DELIVERY",
    "DIRECT_HTTP",
    "EPISODE_ID",
    "FAILURE",
    "FAILURE_REASON",
    "INSTANCE_CONFIG",
    "MCP",
    "NG_ATTEMPT_INDEX",
    "NG_DISPATCH_DRAINED",
    "NG_ENVIRONMENT_SERVER",
    "NG_FAILURE_CLASS",
    "NG_FAILURE_HTTP_STATUS",
    "NG_FAILURE_MESSAGE",
    "NG_FAILURE_PARTIAL_RESPONSE",
    "NG_FAILURE_RESPONSE_BODY",
    "NG_FAILURE_STAGE",
    "NG_FAILURE_TERMINAL",
    "NG_FAILURE_TYPE",
    "NG_NO_PERSIST",
    "NG_RESULT_TYPE",
    "NG_ROLLGYM_AGENT",
    "NG_ROLLOUT_ID",
    "NG_TASK_ID",
    "RESOURCES_COOKIES",
    "RESOURCES_SESSION_ID",
    "RESOURCES_TOOLS",
    "RESULT",
    "ROLLOUT_ID",
    "SANDBOX_ACCESS",
    "TASK",
    "TASKSET",
    "TASK_DATA",
    "TASK_ID",
    "TASK_INPUT",
]
