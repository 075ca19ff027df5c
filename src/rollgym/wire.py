"""The wire vocabulary: every header, cookie, reserved endpoint and field name that rollgym's
servers, agents and collector exchange by name, defined once.

It imports nothing, so every layer (``http/``, ``server/``, ``collect/``, the environments, the
tests) can use it without depending on another layer. The shapes behind the names (task rows,
verify results) are ``rollgym.protocol``'s. Names only one dialect exchanges live in that
dialect's folder, in its own ``wire`` module.
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
"""The cookie carrying the same session id, set on every answer within a session, for agents
that carry cookies only (and keep just those of the latest answer). The header wins when a
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
        "fingerprint",
        "data_files",
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
        "cpu_work",
    }
)
"""Names on a resources server that are never tools (its endpoints, and its ``startup``,
``shutdown`` and ``cpu_work`` hooks): a tool may not be named like one, and an agent never calls one for a
model, whatever it asks for (``rollgym.protocol.is_tool_name``)."""

METRICS_ENDPOINT = "/metrics"
"""``GET``: every rollgym server's Prometheus metrics (and the collector's, on
``--metrics-port``), in the text exposition format (OpenMetrics when the scraper asks for it)."""

# -- task rows and rollouts --------------------------------------------------------------------

NG_TASK_INDEX = "_ng_task_index"
NG_ROLLOUT_INDEX = "_ng_rollout_index"
INDEX_FIELDS = frozenset({"task_index", "rollout_index", NG_TASK_INDEX, NG_ROLLOUT_INDEX})
"""A rollout's indices, in both spellings a task row may use: never metrics."""

PARENT_FIELD = "rollgym_parent"
"""On a task row (and so on its record) of a ``rollgym replay`` run: the recorded rollout it
replays or forks, ``{"run", "rollout", "fork_at"}`` (``fork_at`` null for a plain replay)."""

TERMINAL = "terminal"
FAILURE_KIND = "failure_kind"
STAGE = "stage"
PARTIAL_RESPONSE = "partial_response"
"""The fields of an environment server's failure that ``errors.EnvironmentFailure`` keeps."""

MASK_SAMPLE = "mask_sample"
"""On a verify response: the reward is no measurement (the environment's infrastructure failed);
the sample is left out of every reward statistic and of the trainer's loss."""

ROLLOUT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A valid rollout id (also the ``<id>`` of ``/ng-rollout/<id>/``)."""

ROLLOUT_PREFIX = "ng-rollout"
"""``/ng-rollout/<id>/...``: a path prefix naming the rollout, stripped by every server."""
TOKEN_CAPTURE_SEGMENT = "training-token-capture"
"""``/ng-rollout/<id>/training-token-capture/...``: the same call, asking for token ids."""

CLOSE_SESSION_ENDPOINT = "/close_session"
REVERIFY_MODE_ENDPOINT = "/reverify_mode"
FINGERPRINT_ENDPOINT = "/fingerprint"
"""``GET``: a resources server's fingerprint (``rollgym.server.fingerprint``)."""
HEALTH_STARTING = "starting"
"""``/health``'s ``status`` (with a 503) while a server that answers is still warming up (its
scoring pool): the launcher waits for it under its warm-up bound, not its start-up bound."""
HEALTH_FAILED = "failed"
"""``/health``'s ``status`` (with a 503) of a server whose warm-up failed: the launcher stops
waiting at once (``error`` says why)."""

# -- rollgym's own fields ------------------------------------------------------------------------

ROLLGYM_ERROR = "rollgym_error"
"""A failed rollout's typed error (to_dict)."""
ROLLGYM_ATTEMPTS = "rollgym_attempts"
"""Attempts of a failed rollout."""
MASK_REASON = "rollgym_mask_reason"
"""Why rollgym masked a result."""
ROLLGYM_CONFIG = "rollgym_config"
"""The key naming the rollgym config."""
ROLLGYM_MAX_RESTARTS = "rollgym_max_restarts"
"""Watchdog restarts per 60 s."""
FINGERPRINT_FIELD = "rollgym_fingerprint"
"""On every record: the short id of the fingerprint of the environment that scored it (the
whole fingerprint is in ``run.json``'s ``fingerprints``)."""
COST_FIELD = "rollgym_cost"
"""On every record: what the rollout cost (``rollgym.collect.cost.RolloutCost``)."""
FAILED_CALLS = "rollgym_failed_calls"
"""On a model call's ``UPSTREAM_KEY`` entry: the tokens of each upstream attempt its model
server tried before the one that answered, which failed after it reached the upstream (each
``[input, output]`` from its error's ``usage``, or null: not said), so that an agent counts
what they may have billed (``rollgym.server.usage``)."""
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
    "CLOSE_SESSION_ENDPOINT",
    "COST_FIELD",
    "FAILED_CALLS",
    "FAILURE_KIND",
    "FINGERPRINT_ENDPOINT",
    "FINGERPRINT_FIELD",
    "HEADER_OLDEST_VERSION",
    "HEADER_ROLLOUT",
    "HEALTH_FAILED",
    "HEALTH_STARTING",
    "INDEX_FIELDS",
    "LAYOUT_PATH",
    "MASK_REASON",
    "MASK_SAMPLE",
    "METRICS_ENDPOINT",
    "NG_ROLLOUT_INDEX",
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
    "PARENT_FIELD",
    "PARTIAL_RESPONSE",
    "PAUSE_ENDPOINT",
    "POLICY_ENDPOINT",
    "POLICY_VERSION",
    "REPLICA",
    "RESERVED_ENDPOINTS",
    "RESUME_ENDPOINT",
    "REVERIFY_MODE_ENDPOINT",
    "ROLLGYM_ATTEMPTS",
    "ROLLGYM_CONFIG",
    "ROLLGYM_ERROR",
    "ROLLGYM_MAX_RESTARTS",
    "ROLLOUT_ID_PATTERN",
    "ROLLOUT_PREFIX",
    "SESSION_COOKIE",
    "SESSION_HEADER",
    "STAGE",
    "TERMINAL",
    "TOKEN_CAPTURE_SEGMENT",
    "WEIGHTS_ENDPOINT",
    "session_cookie",
]
