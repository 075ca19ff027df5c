"""The names in rollgym's traces: span names and attribute keys, the contract of a trace.

Standard attributes use OpenTelemetry's semantic-convention names (``http.request.method``,
``error.type``, ...); rollgym's own start with ``rollgym.``. No attribute ever holds a header,
a request or response body, or a URL's credentials (URLs go through ``errors.redact_url``).
"""

from __future__ import annotations

from rollgym.wire import FINGERPRINT_ENDPOINT

INSTRUMENTATION = "rollgym"
"""The instrumentation scope's name (``otel.scope.name`` of every rollgym span)."""

# -- span names --------------------------------------------------------------------------------

ROLLOUT_SPAN = "rollout"
"""The root of a rollout's trace, in the collector (or trainer): from dispatch to its record."""
CIRCUIT_HOLD_SPAN = "rollout.circuit_hold"
"""A rollout held by an open circuit before it is re-sent."""
ROLLOUT_RETRY_SPAN = "rollout.retry_wait"
"""The backoff before a rollout's next attempt (an episode's next attempt, too)."""
RETRY_WAIT_SPAN = "http.retry_wait"
"""The HTTP client's backoff between two attempts of one call."""
SANDBOX_SPAN = "sandbox.run"
"""One program run in the ``code`` environment's sandbox (slot wait included)."""
JUDGE_SPAN = "judge.ask"
"""One question to the ``judge`` environment's judge model."""


UNTRACED_PATHS = frozenset({"/health", "/stats", "/metrics", FINGERPRINT_ENDPOINT})
"""Server paths that make no span: probes, scrapes and the run's one fingerprint read, not a
rollout's work."""


def call_span(server: str, endpoint: str) -> str:
    """The name of an HTTP call's span (all its attempts): ``model /v1/responses``."""
    return f"{server} {endpoint}"


def attempt_span(endpoint: str) -> str:
    """The name of one attempt's client span (OpenTelemetry's ``{method} {target}``)."""
    return f"POST {endpoint}"


# -- attributes: OpenTelemetry's semantic conventions ------------------------------------------

HTTP_METHOD = "http.request.method"
HTTP_STATUS = "http.response.status_code"
URL_FULL = "url.full"
URL_PATH = "url.path"
HTTP_ROUTE = "http.route"
ERROR_TYPE = "error.type"
SERVICE_NAME = "service.name"

# -- attributes: rollgym's ---------------------------------------------------------------------

SERVER = "rollgym.server"
"""The server a span runs in (server spans) or calls (call and attempt spans)."""
SERVER_KIND = "rollgym.server.kind"
"""``agent``, ``model`` or ``resources`` (server spans)."""
ENDPOINT = "rollgym.endpoint"
ROLLOUT = "rollgym.rollout"
"""The rollout's key, ``task_index:rollout_index`` (the ``x-rollgym-rollout`` header)."""
TASK_INDEX = "rollgym.task_index"
ROLLOUT_INDEX = "rollgym.rollout_index"
AGENT = "rollgym.agent"
ATTEMPT = "rollgym.attempt"
"""The number of an attempt (from 1) on attempt and retry-wait spans."""
ATTEMPTS = "rollgym.attempts"
"""How many attempts a call or a rollout made."""
RETRYABLE = "rollgym.retryable"
WILL_RETRY = "rollgym.will_retry"
"""On a failed attempt: whether the client makes another one."""
ERROR_SERVER = "rollgym.error.server"
"""The server a failure is attributed to (``RollgymError.server``)."""
ERROR_STATUS = "rollgym.error.status"
DELAY = "rollgym.delay_s"
"""Seconds of a retry wait or circuit hold."""
REWARD = "rollgym.reward"
OUTCOME = "rollgym.outcome"
"""``scored`` or ``failed`` (rollout spans)."""
POLICY_VERSION = "rollgym.policy_version"
"""The policy version a model call ran under, when its answer says (``rollgym_policy_version``)."""
SANDBOX_MODE = "rollgym.sandbox.mode"
SANDBOX_EXIT = "rollgym.sandbox.exit_code"
SANDBOX_TIMED_OUT = "rollgym.sandbox.timed_out"
SANDBOX_OUTPUT_EXCEEDED = "rollgym.sandbox.output_exceeded"
JUDGE = "rollgym.judge"
"""The judge model server's name (judge spans)."""
