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

HEADER_OLDEST_VERSION = "x-rollgym-oldest-version"
"""Header an agent sends on each model call of a rollout after its first: the oldest policy
version its earlier calls ran under (a non-negative decimal integer; anything else is a 400). A
model server with ``max_staleness = k`` set refuses (409, ``stale_rollout``) a call with
``live - oldest > k``, checked when the call is admitted (after a pause, at its re-issue)."""

SESSION_HEADER = "x-rollgym-session"
"""Header carrying a resources server's session id (from ``/seed_session`` or ``/reset``)."""

SESSION_COOKIE = "rollgym_session"
"""The cookie carrying the same session id, set on every answer within a session: NeMo Gym's
agents carry cookies only (and keep just those of the latest answer). The header wins when a
call sends both."""

SCOPE_ROLLOUT = "rollgym.rollout"
"""The ASGI scope key holding the rollout id of a ``/ng-rollout/<id>/`` path (``server.app.App``),
read where ``HEADER_ROLLOUT`` is (the server's endpoints, its trace span)."""

# -- endpoints --------------------------------------------------------------------------------

RESERVED_ENDPOINTS = frozenset(
    {
        "seed_session",
        "close_session",
        "reverify_mode",
        "verify",
        "aggregate_metrics",
        "tools",
        "health",
        "stats",
        "metrics",
        # Not endpoints, but a server's lifecycle hooks: a @tool of that name would replace
        # the hook, and no model is to ask a server to shut down.
        "startup",
        "shutdown",
    }
)
"""Names on a resources server that are never tools (its endpoints, and its ``startup`` and
``shutdown`` hooks): a tool may not be named like one, and an agent never calls one for a
model, whatever it asks for (``rollgym.protocol.is_tool_name``)."""

METRICS_ENDPOINT = "/metrics"
"""``GET``: every rollgym server's Prometheus metrics (and the collector's, on
``--metrics-port``), in the text exposition format (OpenMetrics when the scraper asks for it)."""

# -- NeMo Gym's field names -------------------------------------------------------------------

NG_TASK_INDEX = "_ng_task_index"
NG_ROLLOUT_INDEX = "_ng_rollout_index"
INDEX_FIELDS = frozenset({"task_index", "rollout_index", NG_TASK_INDEX, NG_ROLLOUT_INDEX})
"""A rollout's indices, in rollgym's and NeMo Gym's spelling: never metrics."""


# -- NeMo Gym 0.7: episodes, sessions, prefixes, failures ---------------------------------------
# The Environment Server protocol: ``POST /run`` takes
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
"""In a ``single_agent_turn`` task input: the environment's fields (0.7 moves a task input's
flat fields other than ``responses_create_params`` into it)."""
RESULT = "result"
FAILURE = "failure"
FAILURE_REASON = "failure_reason"
TERMINAL = "terminal"
FAILURE_KIND = "failure_kind"
STAGE = "stage"
PARTIAL_RESPONSE = "partial_response"
DELIVERY = "delivery"
"""Whether the failed request reached the server: ``not_sent``, ``possibly_delivered`` or
``delivered`` (0.7's ``RolloutFailure.delivery``)."""

MASK_SAMPLE = "mask_sample"
"""On a verify response: the reward is no measurement (the environment's infrastructure failed);
the sample is left out of every reward statistic and of the trainer's loss."""

ROLLOUT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""What 0.7 accepts as a rollout id (also the ``<id>`` of ``/ng-rollout/<id>/``)."""

ROLLOUT_PREFIX = "ng-rollout"
"""``/ng-rollout/<id>/...``: a path prefix naming the rollout, stripped by every server."""
TOKEN_CAPTURE_SEGMENT = "training-token-capture"
"""``/ng-rollout/<id>/training-token-capture/...``: the same call, asking for token ids."""

CLOSE_SESSION_ENDPOINT = "/close_session"
REVERIFY_MODE_ENDPOINT = "/reverify_mode"
AGENT_SESSIONS_ENDPOINT = "/v1/agent_sessions"
AGENT_SESSIONS_CLOSE_ENDPOINT = "/v1/agent_sessions/close"
RESOURCES_SESSION_ID = "resources_session_id"
AGENT_SESSION_ID = "agent_session_id"

NG_TASK_ID = "_ng_task_id"
"""A record's ``{taskset, task_id}`` (0.7), beside its indices."""
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
"""0.7's sidecar failure rows (``<stem>_failures.jsonl``) carry these fields."""

# -- NeMo Gym 0.7 / NeMo RL: further names ------------------------------------------------------

RESOURCES_TOOLS = "resources_tools"
"""0.7's seed answer field."""
SANDBOX_ACCESS = "sandbox_access"
"""0.7's seed answer field."""
AGENT_SESSION_COOKIE = "rollgym_agent_session"
"""The cookie carrying an agent session's id (base64url, so any id is a valid cookie value)."""
DIRECT_HTTP = "direct_http"
MCP = "mcp"
"""0.7's tool-access kinds."""
AGENT_OBSERVATIONS = "agent_observations"
RESOURCES_COOKIES = "resources_cookies"
"""0.7's close answer: the agent's observations (rollgym's: none) and the granted session's
cookie jar as the turn left it."""
INSTANCE_CONFIG = "instance_config"
"""Where NeMo RL reads mask_sample."""
ROLLGYM_ERROR = "rollgym_error"
"""A failed rollout's typed error (to_dict)."""
ROLLGYM_ATTEMPTS = "rollgym_attempts"
"""Attempts of a failed rollout."""
MASK_REASON = "rollgym_mask_reason"
"""Why rollgym masked a result."""
NG_NO_PERSIST = "_ng_no_persist"
"""0.7's marker of a result never written."""
NG_DISPATCH_DRAINED = "_ng_dispatch_drained"
"""0.7's drained-row marker."""
ROLLGYM_CONFIG = "rollgym_config"
"""The key naming the rollgym config."""
ROLLGYM_MAX_RESTARTS = "rollgym_max_restarts"
"""Watchdog restarts per 60 s."""
UPSTREAM_KEY = "rollgym_upstream"
"""The extra object on a model call's answer holding what its model server adds: the upstream's
token-level data, the call's ``POLICY_VERSION``, ``REPLICA`` and ``ABORTED_VERSIONS``."""
PROMPT_IDS = "prompt_token_ids"
GENERATION_IDS = "generation_token_ids"
GENERATION_LOGPROBS = "generation_log_probs"
TOKEN_FIELDS = (PROMPT_IDS, GENERATION_IDS, GENERATION_LOGPROBS)
"""The token data of one model call, on the last output item of its answer, for trainers
(``rollgym.models.tokens``)."""
POLICY_VERSION = "rollgym_policy_version"
"""The version of the weights a model call ran under: on the completion of a model server that
knows it (rollgym's CPU backend; a trainer's own server may add it), and on the call's token
fields, so each trainer sample says which policy made its tokens."""
WEIGHTS_ENDPOINT = "/rollgym/weights"
"""rollgym's CPU backend's weight reload: ``POST {"path", "version"}``; ``GET`` names the
version and path served (``rollgym.models.local``, ``rollgym.integrations.weights``)."""
REPLICA = "rollgym_replica"
"""Which upstream replica answered a model call (its index in the model server's ``base_url``
list): on each ``rollgym_upstream`` entry beside ``POLICY_VERSION``."""
ABORTED_VERSIONS = "rollgym_aborted_versions"
"""The versions under which a model call was started and then aborted by a pause (it was
re-issued after the resume, from the same conversation state): on its ``rollgym_upstream``
entry; absent when the call was never aborted."""
POLICY_ENDPOINT = "/rollgym/policy"
"""A rollgym model server's policy state: ``GET`` answers ``{"version", "paused",
"max_staleness", "in_flight", "held"}``."""
PAUSE_ENDPOINT = "/rollgym/pause"
"""``POST {"abort": bool, "timeout_s": float}`` (defaults: false, 300; ``timeout_s`` in (0,
3600]): hold new model calls (and, with ``abort``, abort the in-flight ones, to be re-issued
after the resume) until ``/rollgym/resume`` or for at most ``timeout_s`` seconds (then the held
calls fail as ``paused_too_long`` and the server unpauses itself); a pause while paused moves
the deadline. Answers ``{"version", "paused", "aborted", "held", "in_flight"}`` once no call is
running upstream (``in_flight`` 0), or at the deadline."""
RESUME_ENDPOINT = "/rollgym/resume"
"""``POST {"version": int, "max_staleness": int | null}``: the weights now live, and the
staleness bound (null: none; left out: unchanged); releases held and aborted calls. Versions
never go back (409); the live version again is allowed. Answers ``{"version", "paused": false,
"max_staleness", "released"}``. Also valid while not paused (a version bump alone)."""
AGENT_OWN_FIELDS = ("num_steps", "truncated", "agent_seconds", "drifted_turns")
"""The numbers rollgym's agents add to a verify response (not the environment's metrics)."""
NG_ROLLGYM_AGENT = "_rollgym_agent"
"""Where an episode's result carries ``AGENT_OWN_FIELDS``: 0.7 aggregates every numeric
top-level field of a result but none whose name starts with ``_``."""
LAYOUT_PATH = "/rollgym_layout"
"""The head server's answer for collectors."""


def session_cookie(session_id: str) -> str:
    """The ``set-cookie`` value that carries ``session_id``."""
    return f"{SESSION_COOKIE}={session_id}; Path=/; HttpOnly; SameSite=lax"


# -- OpenEnv (openenv-core 0.3.0) ------------------------------------------------------------
# Its names, as its server (``openenv.core.env_server.http_server``) and client (``EnvClient``)
# use them: a session is one WebSocket on ``/ws``; each message is ``{"type", "data"}``.

OPENENV_FEATURE = "openenv"
"""What ``impl: openenv`` (``rollgym.openenv.host``) lists among its ``/health`` features."""
OPENENV_WS_PATH = "/ws"
OPENENV_SCHEMA_PATH = "/schema"
OPENENV_RESET = "reset"
OPENENV_STEP = "step"
OPENENV_STATE = "state"
OPENENV_CLOSE = "close"
OPENENV_OBSERVATION = "observation"
"""The answer type of a reset or a step: ``data`` is ``{"observation", "reward", "done"}``."""
OPENENV_ERROR = "error"
"""The answer type of a failure: ``data`` is ``{"message", "code", ...}``."""
OPENENV_CAPACITY_REACHED = "CAPACITY_REACHED"
OPENENV_EXECUTION_ERROR = "EXECUTION_ERROR"
OPENENV_VALIDATION_ERROR = "VALIDATION_ERROR"
OPENENV_FACTORY_ERROR = "FACTORY_ERROR"
OPENENV_SESSION_ERROR = "SESSION_ERROR"

__all__ = [
    "ABORTED_VERSIONS",
    "AGENT_OBSERVATIONS",
    "AGENT_OWN_FIELDS",
    "AGENT_SESSIONS_CLOSE_ENDPOINT",
    "AGENT_SESSIONS_ENDPOINT",
    "AGENT_SESSION_COOKIE",
    "AGENT_SESSION_ID",
    "ATTEMPT",
    "CLOSE_SESSION_ENDPOINT",
    "DELIVERY",
    "DIRECT_HTTP",
    "EPISODE_ID",
    "FAILURE",
    "FAILURE_KIND",
    "FAILURE_REASON",
    "HEADER_OLDEST_VERSION",
    "HEADER_ROLLOUT",
    "INDEX_FIELDS",
    "INSTANCE_CONFIG",
    "LAYOUT_PATH",
    "MASK_REASON",
    "MASK_SAMPLE",
    "MCP",
    "METRICS_ENDPOINT",
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
    "NG_ROLLOUT_INDEX",
    "NG_TASK_ID",
    "NG_TASK_INDEX",
    "OPENENV_CAPACITY_REACHED",
    "OPENENV_CLOSE",
    "OPENENV_ERROR",
    "OPENENV_EXECUTION_ERROR",
    "OPENENV_FACTORY_ERROR",
    "OPENENV_FEATURE",
    "OPENENV_OBSERVATION",
    "OPENENV_RESET",
    "OPENENV_SCHEMA_PATH",
    "OPENENV_SESSION_ERROR",
    "OPENENV_STATE",
    "OPENENV_STEP",
    "OPENENV_VALIDATION_ERROR",
    "OPENENV_WS_PATH",
    "PARTIAL_RESPONSE",
    "PAUSE_ENDPOINT",
    "POLICY_ENDPOINT",
    "POLICY_VERSION",
    "REPLICA",
    "RESERVED_ENDPOINTS",
    "RESOURCES_COOKIES",
    "RESOURCES_SESSION_ID",
    "RESOURCES_TOOLS",
    "RESULT",
    "RESUME_ENDPOINT",
    "REVERIFY_MODE_ENDPOINT",
    "ROLLGYM_ATTEMPTS",
    "ROLLGYM_CONFIG",
    "ROLLGYM_ERROR",
    "ROLLGYM_MAX_RESTARTS",
    "ROLLOUT_ID",
    "ROLLOUT_ID_PATTERN",
    "ROLLOUT_PREFIX",
    "SANDBOX_ACCESS",
    "SESSION_COOKIE",
    "SESSION_HEADER",
    "STAGE",
    "TASK",
    "TASKSET",
    "TASK_DATA",
    "TASK_ID",
    "TASK_INPUT",
    "TERMINAL",
    "TOKEN_CAPTURE_SEGMENT",
    "WEIGHTS_ENDPOINT",
    "session_cookie",
]
