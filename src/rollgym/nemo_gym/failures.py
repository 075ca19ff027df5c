"""NeMo Gym 0.7's failure vocabulary for rollgym's errors, and 0.7's failure records as ours.

    failure_kind(err)            one of FAILURE_KINDS: what went wrong
    terminal(err)                whether the episode must not be tried again
    delivery(err)                not_sent | possibly_delivered | delivered
    failure_stage(err)           where in the episode it failed, if the error says
    episode_failure(err, stage)  0.7's EpisodeFailure JSON for an error
    error_from_failure(...)      0.7's EpisodeFailure JSON -> a typed rollgym error
    sidecar_fields(err)          the _ng_failure_* fields of 0.7's sidecar failure rows
    record_fields(err)           what a 0.7 row's line in failures.jsonl adds to rollgym's

**failure_kind** names the cause, so it is read at the root of the error's ``origin`` chain
(``RollgymError.root``: the server where the failure started), by the root's type:

=====================  ========================  ============================================
type                   failure_kind              where the root lies changes it to
=====================  ========================  ============================================
rollgym_error          agent_run_error           (a)(b)(c)
config_error           agent_request_failed      (a)(b)(c)
input_error            agent_request_failed      (a)(b)(c)
invalid_request        agent_request_failed      (a)(b)(c)
request_too_large      agent_request_failed      (a)(b)(c)
bad_checkpoint         agent_request_failed      (a)(b)(c)
http_status            agent_run_error           (a)(b)(c)(d)
capacity_reached       transport_unreachable     (a)(b)
protocol_error         agent_run_error           (a)(b)(c)
unparseable_verdict    judge_unparseable         -
token_data             agent_run_error           (a)(b)(c)
transport_error        transport_unreachable     (a)(b)
connect_error          transport_unreachable     (a)(b)
session_lost           session_lost              -
connection_lost        transport_peer_drop       (a)(b)
read_timeout           transport_timeout         (a)(b)
replica_down           transport_timeout         (a)(b)
replica_stalled        transport_timeout         (a)(b)
answer_too_large       transport_local_resource  (a)(b)
deadline_exceeded      transport_timeout         (a)(b)(e)
waited_too_long        transport_timeout         (a)(b)(e)
paused_too_long        transport_timeout         (a)(b)
budget_exhausted       transport_unreachable     the kind of the failure it stopped, if any
circuit_open           transport_unreachable     the kind of the failure it stopped, if any
rollout_error          agent_run_error           (a)(b)(c)
stale_rollout          cancelled                 -
environment_failure    agent_run_error           its own failure_kind when it has one
internal_error         agent_run_error           (a)(b)(c)
sandbox_error          provider_unavailable      -
container_error        provider_unavailable      -
image_build_error      provider_unavailable      -
scorer_error           agent_run_error           (a)(b)(c)
verifier_error         agent_run_error           (a)(b)(c)
weights_not_restored   provider_unavailable      -
launch_error           transport_unreachable     (a)(b)
run_aborted            cancelled                 -
=====================  ========================  ============================================

The stage of the failure (``failure_stage``: the first hop of the chain below ``/run``) refines
the rows marked:

- (a) at ``cleanup`` (``/close_session``): ``session_release_failed``;
- (b) at ``verification`` (``/verify``), the root in another server than the verifier (the
  judge model behind it): ``judge_failed``, whatever failed there (0.7: "judge call failed
  (transport/HTTP/auth)");
- (c) at ``verification``, the root in the verifier itself: ``verifier_error``; at ``seed`` or
  ``agent`` (a model or tool call inside the rollout): ``agent_run_error`` (the rollout ran);
- (d) at ``/run`` itself, a 429/502/503/504 with no rollgym error behind it (a proxy in front
  of the agent answered): ``agent_request_failed``;
- (e) the rollout's own deadline (at ``/run``): ``agent_timeout``.

The names 0.7 has but rollgym never produces: ``agent_command_not_allowed``,
``provider_quota_exhausted``, ``provider_oom_killed``, ``session_expired``, ``kill_shaped``,
``shutdown``, ``persistence_failed``, ``cohort_incomplete`` (an ``EnvironmentFailure`` keeps
whichever name its environment gave, namespaced ``<server>:<kind>`` ones too).

**terminal** is rollgym's own retry judgement of the root: an environment's own ``terminal``;
a 4xx (not 408/429) or a refused input, terminal; a failure of the moment (no connection, a
lost connection, a timeout, an open circuit, a spent retry budget, a stopped run) not;
otherwise ``not retryable``, which the HTTP client set after its last attempt ("may a caller
run the whole thing again").

**delivery** is what the transport knows of the call the error describes: refused before
sending (connection refused, circuit open, retry budget spent) is ``not_sent``, unless an
earlier attempt of the same call was sent, whose delivery it then has; an answer (a status, an
unusable body, an environment's failure) is ``delivered``; a timeout or a connection lost after
sending is ``possibly_delivered``, as is anything the transport cannot vouch for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Final, Literal, get_args

import orjson

from rollgym.errors import (
    AnswerTooLarge,
    BudgetExhausted,
    CircuitOpen,
    ConfigError,
    ConnectError,
    DeadlineExceeded,
    EnvironmentFailure,
    HTTPStatusError,
    InvalidRequest,
    LaunchError,
    ProtocolError,
    RollgymError,
    RunAborted,
    TransportError,
)
from rollgym.nemo_gym.wire import (
    AGENT_SESSIONS_CLOSE_ENDPOINT,
    AGENT_SESSIONS_ENDPOINT,
    DELIVERY,
    FAILURE_REASON,
    NG_FAILURE_CLASS,
    NG_FAILURE_HTTP_STATUS,
    NG_FAILURE_MESSAGE,
    NG_FAILURE_PARTIAL_RESPONSE,
    NG_FAILURE_RESPONSE_BODY,
    NG_FAILURE_STAGE,
    NG_FAILURE_TERMINAL,
    NG_FAILURE_TYPE,
)
from rollgym.wire import (
    CLOSE_SESSION_ENDPOINT,
    FAILURE_KIND,
    PARTIAL_RESPONSE,
    ROLLOUT_PREFIX,
    STAGE,
    TERMINAL,
    TOKEN_CAPTURE_SEGMENT,
)

log = logging.getLogger("rollgym.nemo_gym")

# TODO(wire): 0.7's failure vocabulary (nemo_gym/failure_kinds.py), its stages, its delivery
# states and the sidecar's environment-server class are values on the wire; they live here
# until wire.py takes them.
TRANSPORT_UNREACHABLE: Final = "transport_unreachable"
TRANSPORT_PEER_DROP: Final = "transport_peer_drop"
TRANSPORT_TIMEOUT: Final = "transport_timeout"
TRANSPORT_LOCAL_RESOURCE: Final = "transport_local_resource"
AGENT_RUN_ERROR: Final = "agent_run_error"
AGENT_REQUEST_FAILED: Final = "agent_request_failed"
AGENT_TIMEOUT: Final = "agent_timeout"
AGENT_COMMAND_NOT_ALLOWED: Final = "agent_command_not_allowed"
JUDGE_FAILED: Final = "judge_failed"
JUDGE_UNPARSEABLE: Final = "judge_unparseable"
VERIFIER_ERROR: Final = "verifier_error"
PROVIDER_UNAVAILABLE: Final = "provider_unavailable"
PROVIDER_QUOTA_EXHAUSTED: Final = "provider_quota_exhausted"
PROVIDER_OOM_KILLED: Final = "provider_oom_killed"
SESSION_LOST: Final = "session_lost"
SESSION_EXPIRED: Final = "session_expired"
SESSION_RELEASE_FAILED: Final = "session_release_failed"
CANCELLED: Final = "cancelled"
KILL_SHAPED: Final = "kill_shaped"
SHUTDOWN: Final = "shutdown"
PERSISTENCE_FAILED: Final = "persistence_failed"
COHORT_INCOMPLETE: Final = "cohort_incomplete"

FAILURE_KINDS: frozenset[str] = frozenset(
    {
        TRANSPORT_UNREACHABLE, TRANSPORT_PEER_DROP, TRANSPORT_TIMEOUT, TRANSPORT_LOCAL_RESOURCE,
        AGENT_RUN_ERROR, AGENT_REQUEST_FAILED, AGENT_TIMEOUT, AGENT_COMMAND_NOT_ALLOWED,
        JUDGE_FAILED, JUDGE_UNPARSEABLE, VERIFIER_ERROR,
        PROVIDER_UNAVAILABLE, PROVIDER_QUOTA_EXHAUSTED, PROVIDER_OOM_KILLED,
        SESSION_LOST, SESSION_EXPIRED, SESSION_RELEASE_FAILED,
        CANCELLED, KILL_SHAPED, SHUTDOWN,
        PERSISTENCE_FAILED, COHORT_INCOMPLETE,
    }
)  # fmt: skip
"""0.7's 22 names (``nemo_gym.failure_kinds.FAILURE_KINDS``)."""

Stage = Literal["admission", "seed", "agent", "verification", "cleanup"]
STAGES: tuple[Stage, ...] = get_args(Stage)
"""0.7's ``FailureStage``, in the order an episode goes through them."""

Delivery = Literal["not_sent", "possibly_delivered", "delivered"]
DELIVERIES: tuple[Delivery, ...] = get_args(Delivery)

ENVIRONMENT_SERVER_FAILED: Final = "environment_server_failed"
"""The sidecar's ``_ng_failure_class`` of an Environment Server's handled failure."""

REASON_LIMIT = 2000
"""0.7's ``EpisodeFailure.failure_reason`` holds at most this many characters (so does its
sidecar's response body)."""

KIND_BY_TYPE: dict[str, str] = {
    "rollgym_error": AGENT_RUN_ERROR,
    "config_error": AGENT_REQUEST_FAILED,
    "input_error": AGENT_REQUEST_FAILED,
    "invalid_request": AGENT_REQUEST_FAILED,
    "request_too_large": AGENT_REQUEST_FAILED,
    "bad_checkpoint": AGENT_REQUEST_FAILED,  # weights refused before anything was sent
    "http_status": AGENT_RUN_ERROR,
    "capacity_reached": TRANSPORT_UNREACHABLE,  # a full server: it could not take the session
    "protocol_error": AGENT_RUN_ERROR,
    "unparseable_verdict": JUDGE_UNPARSEABLE,
    "token_data": AGENT_RUN_ERROR,
    "transport_error": TRANSPORT_UNREACHABLE,
    "connect_error": TRANSPORT_UNREACHABLE,
    "session_lost": SESSION_LOST,
    "connection_lost": TRANSPORT_PEER_DROP,
    "read_timeout": TRANSPORT_TIMEOUT,
    "replica_down": TRANSPORT_TIMEOUT,  # a model replica that failed its liveness probe
    "replica_stalled": TRANSPORT_TIMEOUT,  # ... or made no progress
    "answer_too_large": TRANSPORT_LOCAL_RESOURCE,
    "deadline_exceeded": TRANSPORT_TIMEOUT,
    # A deadline that ran out before a worker took the call: still a timeout to 0.7.
    "waited_too_long": TRANSPORT_TIMEOUT,
    # A pause for a weight update that no resume ended: the model call's time ran out.
    "paused_too_long": TRANSPORT_TIMEOUT,
    "budget_exhausted": TRANSPORT_UNREACHABLE,
    "circuit_open": TRANSPORT_UNREACHABLE,
    "rollout_error": AGENT_RUN_ERROR,
    # Cancelled in flight by the trainer's staleness bound: no server failed.
    "stale_rollout": CANCELLED,
    "environment_failure": AGENT_RUN_ERROR,
    "internal_error": AGENT_RUN_ERROR,
    "sandbox_error": PROVIDER_UNAVAILABLE,
    # A container provider (podman, a remote sandbox) that failed a call, or an image that
    # cannot be built here: the provider, as 0.7 names its sandboxes' failures.
    "container_error": PROVIDER_UNAVAILABLE,
    "image_build_error": PROVIDER_UNAVAILABLE,
    # A dataset's own scorer that cannot score a row: at verification, a verifier_error.
    "scorer_error": AGENT_RUN_ERROR,
    # A container task's verifier that left no readable reward: at verification, verifier_error.
    "verifier_error": AGENT_RUN_ERROR,
    # An inference server left unable to serve by a failed weight push.
    "weights_not_restored": PROVIDER_UNAVAILABLE,
    "launch_error": TRANSPORT_UNREACHABLE,
    "run_aborted": CANCELLED,
}
"""Each error type's failure_kind before its stage refines it (the table above). A type of the
tree missing here is a test failure; a type this process does not know reads as
``rollgym_error``."""

_FIXED = frozenset({SESSION_LOST, JUDGE_UNPARSEABLE, PROVIDER_UNAVAILABLE, CANCELLED})
"""Kinds that name the cause wherever it happened: no stage refines them."""
_TRANSPORT = frozenset(
    {TRANSPORT_UNREACHABLE, TRANSPORT_PEER_DROP, TRANSPORT_TIMEOUT, TRANSPORT_LOCAL_RESOURCE}
)
_GATEWAY_STATUSES = frozenset({429, 502, 503, 504})
"""What 0.7 reads as "something in front of the server answered" (the rollout did not run)."""

RUN_ENDPOINT = "/run"
_NO_STAGE = frozenset({RUN_ENDPOINT, "/aggregate_metrics"})
_STAGE_OF_ENDPOINT: dict[str, Stage] = {
    "/seed_session": "seed",
    AGENT_SESSIONS_ENDPOINT: "seed",
    "/verify": "verification",
    CLOSE_SESSION_ENDPOINT: "cleanup",
    AGENT_SESSIONS_CLOSE_ENDPOINT: "cleanup",
}
"""Endpoints that say where an episode was; any other (a model's, a tool's) is ``agent``."""

_warned_kinds: set[str] = set()


# -- reading an error -----------------------------------------------------------------------


def _chain(err: RollgymError) -> Iterator[RollgymError]:
    node: RollgymError | None = err
    while node is not None:
        yield node
        node = node.origin


def _environment_failure(err: RollgymError) -> EnvironmentFailure | None:
    """The Environment Server's failure that ``err`` is, or reports from another server."""
    for node in (err, err.root()):
        if isinstance(node, EnvironmentFailure):
            return node
    return None


def _cause(err: RollgymError) -> RollgymError:
    """The root of ``err``, and past a refused retry or an open circuit the failure it stopped
    (that failure names the cause; the refusal only says that it was not tried again)."""
    root = err.root()
    while isinstance(root, (BudgetExhausted, CircuitOpen)) and root.origin is not None:
        root = root.origin.root()
    return root


def _path(endpoint: str | None) -> str | None:
    """``endpoint`` without 0.7's ``/ng-rollout/<id>/`` (and token-capture) prefix."""
    if not endpoint:
        return None
    parts = endpoint.split("/")
    if len(parts) > 3 and parts[1] == ROLLOUT_PREFIX:
        parts = ["", *parts[3:]]
        if len(parts) > 2 and parts[1] == TOKEN_CAPTURE_SEGMENT:
            parts = ["", *parts[2:]]
    return "/".join(parts)


def _stage_hop(err: RollgymError) -> tuple[Stage | None, RollgymError | None]:
    """The stage of ``err`` and the error of the hop that says so: an environment's failure
    its own stage; else the first call of the chain that is not ``/run`` itself."""
    for node in _chain(err):
        if isinstance(node, EnvironmentFailure) and node.stage in STAGES:
            return node.stage, node
        path = _path(node.endpoint)
        if path is None or path in _NO_STAGE:
            continue
        return _STAGE_OF_ENDPOINT.get(path, "agent"), node
    return None, None


def failure_stage(err: RollgymError) -> Stage | None:
    """Where in the episode ``err`` happened, if its chain says (see the module's table)."""
    return _stage_hop(err)[0]


def failure_kind(err: RollgymError) -> str:
    """0.7's name for what went wrong in ``err`` (the module's table). One of ``FAILURE_KINDS``,
    unless an Environment Server gave a name of its own, which is kept."""
    env = _environment_failure(err)
    if env is not None and env.failure_kind:
        return env.failure_kind
    cause = _cause(err)
    kind = KIND_BY_TYPE.get(cause.type, AGENT_RUN_ERROR)
    if kind in _FIXED:
        return kind
    if isinstance(cause, DeadlineExceeded) and _path(cause.endpoint) == RUN_ENDPOINT:
        return AGENT_TIMEOUT
    stage, hop = _stage_hop(err)
    if stage == "cleanup":
        return SESSION_RELEASE_FAILED
    if stage == "verification" and hop is not None:
        if cause.server not in (None, hop.server):
            return JUDGE_FAILED
        return kind if kind in _TRANSPORT else VERIFIER_ERROR
    if stage is None:
        if (
            isinstance(cause, HTTPStatusError)
            and cause.origin is None
            and cause.status in _GATEWAY_STATUSES
        ):
            return AGENT_REQUEST_FAILED
        return kind
    return AGENT_RUN_ERROR if kind == AGENT_REQUEST_FAILED else kind


def terminal(err: RollgymError) -> bool:
    """Whether the episode that failed with ``err`` must not be tried again (rollgym's retry
    judgement of its cause; see the module docstring)."""
    env = _environment_failure(err)
    if env is not None:
        return env.terminal
    cause = _cause(err)
    status = cause.status
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return True
    if isinstance(cause, (InvalidRequest, ConfigError)):
        return True
    if isinstance(cause, TransportError) and not isinstance(cause, AnswerTooLarge):
        return False
    if isinstance(cause, (BudgetExhausted, CircuitOpen, RunAborted, LaunchError)):
        return False
    return not cause.retryable


def delivery(err: RollgymError) -> Delivery:
    """Whether the call ``err`` describes reached its server (see the module docstring)."""
    if isinstance(err, (ConnectError, CircuitOpen, BudgetExhausted, DeadlineExceeded)):
        # Refused (or out of time) before this attempt: an earlier attempt of the same call
        # may have been sent, and then this one's fate is that attempt's.
        earlier = err.origin
        if earlier is not None and earlier.server == err.server:
            return delivery(earlier)
        return "possibly_delivered" if isinstance(err, DeadlineExceeded) else "not_sent"
    if isinstance(err, (LaunchError, ConfigError)):
        return "not_sent"
    if isinstance(err, AnswerTooLarge):
        return "delivered"  # the answer came; it was not read past the limit
    if isinstance(err, TransportError):
        return "possibly_delivered"
    if err.status is not None or isinstance(
        err, (HTTPStatusError, ProtocolError, EnvironmentFailure)
    ):
        return "delivered"
    return "possibly_delivered"


# -- 0.7's records ----------------------------------------------------------------------------


def _reason(err: RollgymError) -> str:
    """The text of a failure, at most ``REASON_LIMIT`` characters: an environment's own reason as
    it gave it, else the error with where it happened and its causes."""
    text = err.message if isinstance(err, EnvironmentFailure) else str(err)
    if len(text) <= REASON_LIMIT:
        return text
    kept = REASON_LIMIT - 40
    return f"{text[:kept]}... [{len(text) - kept} more characters cut]"


def episode_failure(err: RollgymError, stage: Stage | None = None) -> dict[str, Any]:
    """0.7's ``EpisodeFailure`` JSON for ``err``: ``failure_reason``, ``terminal``,
    ``failure_kind``, and ``stage`` (the one given, else ``failure_stage``) and an environment's
    ``partial_response`` when there are any (0.7 leaves unset ones out)."""
    out: dict[str, Any] = {
        FAILURE_REASON: _reason(err),
        TERMINAL: terminal(err),
        FAILURE_KIND: failure_kind(err),
    }
    stage = stage or failure_stage(err)
    if stage is not None:
        out[STAGE] = stage
    env = _environment_failure(err)
    if env is not None and env.partial_response is not None:
        out[PARTIAL_RESPONSE] = env.partial_response
    return out


def error_from_failure(
    failure: dict[str, Any], *, server: str | None = None, endpoint: str | None = None
) -> RollgymError:
    """The typed error for 0.7's ``EpisodeFailure`` JSON from Environment Server ``server``: an
    ``EnvironmentFailure`` keeping its reason, ``terminal``, ``stage``, ``failure_kind`` and
    ``partial_response``. Not one (no text ``failure_reason``, no boolean ``terminal``, a stage
    0.7 has not): a ``ProtocolError`` naming what is wrong, with the failure as its body. An
    unknown ``failure_kind`` is kept, with one warning per name, as 0.7 does."""
    where: dict[str, Any] = {"server": server, "endpoint": endpoint}
    problem = _not_a_failure(failure)
    if problem is not None:
        return ProtocolError(
            f"{server or 'the server'} answered a failure that {problem}",
            body=_json_text(failure), **where,
        )  # fmt: skip
    kind = failure.get(FAILURE_KIND)
    if kind is not None and kind not in FAILURE_KINDS | _warned_kinds and ":" not in kind:
        _warned_kinds.add(kind)
        log.warning("%s: failure_kind %r is not one of 0.7's names (kept)", server, kind)
    return EnvironmentFailure(
        failure[FAILURE_REASON], terminal=failure[TERMINAL], stage=failure.get(STAGE),
        failure_kind=kind, partial_response=failure.get(PARTIAL_RESPONSE), **where,
    )  # fmt: skip


def _not_a_failure(failure: Any) -> str | None:
    if not isinstance(failure, dict):
        return f"is no JSON object ({type(failure).__name__})"
    if not isinstance(failure.get(FAILURE_REASON), str):
        return f"has no text '{FAILURE_REASON}'"
    if not isinstance(failure.get(TERMINAL), bool):
        return f"has no boolean '{TERMINAL}'"
    stage = failure.get(STAGE)
    if stage is not None and stage not in STAGES:
        return f"has '{STAGE}' {stage!r}, not one of {', '.join(STAGES)}"
    kind = failure.get(FAILURE_KIND)
    if kind is not None and not isinstance(kind, str):
        return f"has a '{FAILURE_KIND}' that is no text"
    return None


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def failure_class(err: RollgymError) -> str:
    """The sidecar's ``_ng_failure_class`` for a rollout that failed with ``err``, as 0.7's
    collector names what its ``/run`` call saw: ``environment_server_failed`` for an
    Environment Server's failure; ``agent_request_failed`` when no rollout ran (no answer came,
    a proxy in front of the agent answered 429/502/503/504, the agent refused the request:
    ``failure_kind`` says so); else ``agent_run_error``, the rollout ran and broke."""
    if isinstance(err, EnvironmentFailure):
        return ENVIRONMENT_SERVER_FAILED
    if delivery(err) != "delivered" or failure_kind(err) == AGENT_REQUEST_FAILED:
        return AGENT_REQUEST_FAILED
    return AGENT_RUN_ERROR


def sidecar_fields(err: RollgymError) -> dict[str, Any]:
    """The ``_ng_failure_*`` fields 0.7's sidecar rows carry for a rollout that failed with
    ``err``: class, terminal and message always; an Environment Server's failure adds its stage
    and partial response (0.7's ``_episode_record``), any other the error's type, HTTP status
    and response body (its failed-``/run`` row), and its stage when the chain says one."""
    out: dict[str, Any] = {
        NG_FAILURE_CLASS: failure_class(err),
        NG_FAILURE_TERMINAL: terminal(err),
        NG_FAILURE_MESSAGE: _reason(err),
    }
    if not isinstance(err, EnvironmentFailure):
        out[NG_FAILURE_TYPE] = type(err).__name__
        out[NG_FAILURE_HTTP_STATUS] = err.status
        out[NG_FAILURE_RESPONSE_BODY] = err.body[:REASON_LIMIT] if err.body else None
    stage = failure_stage(err)
    if stage is not None:
        out[NG_FAILURE_STAGE] = stage
    env = _environment_failure(err)
    if env is not None and env.partial_response is not None:
        out[NG_FAILURE_PARTIAL_RESPONSE] = env.partial_response
    return out


SHOWN = 200
"""Characters of ``_ng_failure_message`` a 0.7 reader shows (its reverification and collection
summaries cut it there); the whole error is rollgym's own, beside it."""


def record_fields(err: RollgymError) -> dict[str, Any]:
    """What a 0.7 row's line in ``failures.jsonl`` carries beside rollgym's (whose ``error`` is
    the whole chain, body and partial response included): ``failure_kind``, ``delivery`` and
    the ``_ng_failure_*`` fields 0.7's readers of a ``<stem>_failures.jsonl`` sidecar read, its
    message cut to what they show, without a second copy of the body."""
    full = sidecar_fields(err)
    out: dict[str, Any] = {FAILURE_KIND: failure_kind(err), DELIVERY: delivery(err)}
    out.update((k, v) for k, v in full.items() if k not in _REPEATED)
    message = full[NG_FAILURE_MESSAGE]
    out[NG_FAILURE_MESSAGE] = message if len(message) <= SHOWN else f"{message[: SHOWN - 3]}..."
    return out


_REPEATED = frozenset({NG_FAILURE_RESPONSE_BODY, NG_FAILURE_PARTIAL_RESPONSE})
"""Sidecar fields a line's ``error`` holds already."""

__all__ = [
    "DELIVERIES",
    "ENVIRONMENT_SERVER_FAILED",
    "FAILURE_KINDS",
    "KIND_BY_TYPE",
    "STAGES",
    "Delivery",
    "Stage",
    "delivery",
    "episode_failure",
    "error_from_failure",
    "failure_class",
    "failure_kind",
    "failure_stage",
    "record_fields",
    "sidecar_fields",
    "terminal",
]
