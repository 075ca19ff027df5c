"""The one error tree of rollgym.

A failure is data: every error rollgym raises or records is a plain record that pickles, crosses
a ``spawn`` process or a Ray actor boundary with its type and fields intact, and converts to and
from a JSON dict (what goes into ``failures.jsonl`` and into error response bodies). No error
keeps headers, cookies, credentials or live objects; ``origin`` is the upstream error that caused
this one, as the same kind of record.

    RollgymError
    ├── ConfigError            a config file, CLI option or input file is wrong (never retried)
    │   └── InputError         one line of a task file is malformed
    ├── InvalidRequest         a request to a rollgym server is malformed (answered 4xx)
    │   ├── RequestTooLarge    a request past one of the server's limits (413, 431)
    │   └── BadCheckpoint      weights to push are missing, no checkpoint, or do not match the
    │                          served model (names, shapes, dtypes): nothing was sent
    ├── HTTPStatusError        a server answered with a non-2xx status
    │   └── CapacityReached    a server with a session limit is full (OpenEnv's
    │                          ``max_concurrent_envs``): 503, retried per its policy
    ├── ProtocolError          a server answered 2xx with a body we cannot use (bad JSON, shape)
    │   ├── UnparseableVerdict a judge model answered, but no verdict could be read from it
    │   └── TokenDataError     a rollout's token data cannot make a trainer sample (missing,
    │                          malformed, or a turn that does not extend the ones before it)
    ├── TransportError         no usable answer at all
    │   ├── ConnectError       connection refused / nothing was sent (always safe to retry)
    │   │   └── SessionLost    the replica holding this call's session is gone (never retried)
    │   ├── ConnectionLost     connection reset or closed after the request was sent
    │   ├── ReadTimeout        no answer within the per-attempt timeout
    │   │   └── ReplicaDown    a watched model replica failed its liveness probe: every call
    │   │       │              in flight there failed at once, and its breaker opened
    │   │       └── ReplicaStalled  ... its API answers, but its engine made no progress
    │   ├── AnswerTooLarge     an answer past one of the caller's limits (never retried)
    │   └── DeadlineExceeded   the total deadline (across attempts, or of a rollout) ran out
    │       ├── WaitedTooLong  ... before the work began (waiting for a worker)
    │       └── PausedTooLong  ... while model calls were paused for a weight update
    ├── BudgetExhausted        the retry budget of the called server refused another retry
    ├── CircuitOpen            the called server's circuit breaker is open
    ├── RolloutError           the rollout itself could not finish (e.g. too many steps)
    ├── StaleRollout           the rollout's oldest model call is more than the allowed number
    │                          of policy versions behind the live weights (an outcome of
    │                          asynchronous training, not a server's failure)
    ├── EnvironmentFailure     an environment server answered an episode with a handled
    │                          failure: terminal, stage, failure_kind, partial_response
    ├── InternalError          a bug or unexpected exception inside a rollgym server
    │   ├── SandboxError       an environment's sandbox could not run the code (not the code)
    │   │   └── ContainerError a container provider (podman, a remote one) failed a call
    │   │       └── ImageBuildError  a task's image cannot be built (offline): names the line
    │   ├── ScorerError        an environment's scorer cannot score a row (it fails on the
    │   │                      row's own reference answer, or kills its worker)
    │   └── VerifierError      a container task's verifier left no reward that can be read
    │                          (none, empty, unparseable, non-finite) or did not finish
    ├── WeightsNotRestored     a weight push failed and the inference server could not be
    │                          brought back to serving its previous weights (or unpaused)
    ├── LaunchError            a server could not be started or never became healthy
    └── RunAborted             the run-level failure budget stopped the run

aiohttp's exceptions become these in exactly one place: ``rollgym.http.translate``; a dialect's
failure records in its own folder.

A class may carry fields of its own beside the common ones (``extra_fields``; only
``EnvironmentFailure`` does): they pickle, convert to and from JSON and survive ``with_fields``
like the others, and every other class's JSON form is unchanged.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Self, SupportsIndex
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from rollgym.credentials import mask, remember_url
from rollgym.wire import FAILURE_KIND, PARTIAL_RESPONSE, STAGE, TERMINAL

BODY_LIMIT = 4096
"""Bodies are kept up to this many characters; longer ones are cut and flagged ``truncated``."""
MESSAGE_LIMIT = 2048
"""Messages are kept up to this many characters (an upstream may put megabytes in one)."""
PARTIAL_LIMIT = 4 * BODY_LIMIT
"""A partial response (``EnvironmentFailure``) is kept up to this many bytes of JSON; a larger
one is dropped and the error flagged ``truncated``."""
ORIGIN_DEPTH = 8
"""At most this many errors in an ``origin`` chain; deeper causes are dropped (the root's
server is what a reader needs, and a chain must not grow with every hop)."""

_SECRET_PARAM = re.compile(
    r"(key|token|secret|password|passwd|signature|sig|auth|credential)", re.I
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_KEYLIKE = re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}")

_REGISTRY: dict[str, type[RollgymError]] = {}


def redact_url(url: str | None) -> str | None:
    """Drop userinfo, the fragment and the values of secret-looking query parameters from
    ``url``, and mask API-key-looking path segments."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if "@" in parts.netloc:
        # What is dropped here is masked from now on wherever it shows (rollgym.credentials).
        remember_url(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "REDACTED" if _SECRET_PARAM.search(k) else v) for k, v in pairs], safe="/:"
        )
    path = _KEYLIKE.sub("REDACTED", parts.path)
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def redact_text(text: str) -> str:
    """Mask bearer tokens, API-key-looking strings and the credentials this process has seen in
    a URL (in any form: ``rollgym.credentials``), which a server may echo in a body."""
    text = mask(text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} REDACTED", text)
    return _KEYLIKE.sub("REDACTED", text)


def _valid_text(text: str) -> str:
    """``text`` without lone surrogates (they cannot be written as UTF-8 JSON)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def bound_message(message: object) -> str:
    """Redact and cut a message to ``MESSAGE_LIMIT`` characters, saying how much was cut."""
    text = _redacted_prefix(str(message), MESSAGE_LIMIT)
    if len(text) <= MESSAGE_LIMIT:
        return text
    # The result is at most MESSAGE_LIMIT long, so bounding it again (from_dict) keeps it.
    kept = MESSAGE_LIMIT - 40
    return f"{text[:kept]}... [{len(text) - kept} more characters cut]"


def bound_body(body: str | bytes | bytearray | None) -> tuple[str | None, bool]:
    """Decode and cut a response body to ``BODY_LIMIT`` characters; return (text, truncated)."""
    if body is None:
        return None, False
    truncated = False
    if isinstance(body, (bytes, bytearray)):
        raw = bytes(body)
        # A UTF-8 character is at most 4 bytes, so this many bytes always hold BODY_LIMIT
        # characters; anything past it was cut even when the decoded text fits the limit.
        truncated = len(raw) > BODY_LIMIT * 4
        body = raw[: BODY_LIMIT * 4].decode("utf-8", errors="replace")
    text = _redacted_prefix(body, BODY_LIMIT)
    truncated = truncated or len(text) > BODY_LIMIT
    return text[:BODY_LIMIT], truncated


_REDACT_MARGIN = 4096
"""Characters past a limit still read by the redaction: a secret (shorter than this) that
straddles the cut is recognised whole, and nothing past the margin is scanned at all (every
remembered credential's pattern over a 10 MB body held a test for minutes)."""


def _redacted_prefix(text: str, limit: int) -> str:
    """``text``'s first ``limit`` characters and the margin after them, redacted; a text cut
    here stays longer than ``limit``, so its caller still says that it was cut."""
    return redact_text(_valid_text(text[: limit + _REDACT_MARGIN]))


class RollgymError(Exception):
    """Root of every rollgym error: a plain record of what failed, where, and whether to retry."""

    type: ClassVar[str] = "rollgym_error"
    default_retryable: ClassVar[bool] = False
    extra_fields: ClassVar[tuple[str, ...]] = ()
    """Fields of this class beyond the common ones (keyword arguments of its constructor)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | bytes | None = None,
        truncated: bool = False,
        url: str | None = None,
        method: str | None = None,
        server: str | None = None,
        endpoint: str | None = None,
        attempts: int = 1,
        retryable: bool | None = None,
        origin: RollgymError | None = None,
    ) -> None:
        # The URL first: credentials it carries are then masked in the message and body too.
        self.url = redact_url(None if url is None else str(url))
        message = bound_message(message)
        # ``args`` too gets the redacted message: anything that prints ``err.args`` must not
        # show a token the message carried.
        super().__init__(message)
        self.message = message
        self.status = None if status is None else int(status)
        self.body, cut = bound_body(body)
        self.truncated = bool(truncated) or cut
        self.method = _opt_str(method)
        self.server = _opt_str(server)
        self.endpoint = _opt_str(endpoint)
        self.attempts = int(attempts)
        self.retryable = self.default_retryable if retryable is None else bool(retryable)
        self.origin = _capped(_as_origin(origin), ORIGIN_DEPTH - 1)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Only a class that names its own ``type`` is registered: a subclass that inherits the
        # ``type`` of its parent must not take over the parent's records in ``from_dict``.
        if "type" in cls.__dict__:
            _REGISTRY[cls.type] = cls

    # Pickle through the plain fields: Exception's default reduce would call __init__ with
    # positional args only and lose every keyword field.
    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.fields()))

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        # Ray re-raises an actor's error as ``RayTaskError(<our class>)``, a class it makes on
        # the fly (both RayTaskError and ours, ours kept as ``cause``): pickle finds no such
        # class to load it by. Send such an error on as the plain error it wraps.
        cause = self.__dict__.get("cause")
        if isinstance(cause, RollgymError) and type(cause) is not type(self):
            return cause.__reduce_ex__(protocol)
        return self.__reduce__()

    def fields(self) -> dict[str, Any]:
        """Every field as a plain value (``origin`` stays an error object)."""
        return {
            "message": self.message,
            "status": self.status,
            "body": self.body,
            "truncated": self.truncated,
            "url": self.url,
            "method": self.method,
            "server": self.server,
            "endpoint": self.endpoint,
            "attempts": self.attempts,
            "retryable": self.retryable,
            "origin": self.origin,
            **{name: getattr(self, name) for name in self.extra_fields},
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used in ``failures.jsonl`` and in error response bodies."""
        data = self.fields()
        data["origin"] = self.origin.to_dict() if self.origin is not None else None
        return {"type": self.type, **data}

    def to_record(self) -> dict[str, Any]:
        """The compact JSON form of a run's records (``failures.jsonl``): ``to_dict`` without
        the fields that say nothing (None, not truncated, one attempt, the class's own
        ``retryable``), which ``from_dict`` restores as they were. A chain of three errors is
        a line, not a page."""
        data: dict[str, Any] = {"type": self.type}
        for name, value in self.fields().items():
            if name == "origin":
                if value is not None:
                    data["origin"] = value.to_record()
            elif name == "retryable":
                if value != self.default_retryable:
                    data[name] = value
            elif name == "body" and self.origin is not None and _bare_envelope(value):
                continue  # a relay's own envelope: its origin, below, says it all
            elif value is not None and _SAYS[name](value):
                data[name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RollgymError:
        """Rebuild an error from ``to_dict`` output; an unknown ``type`` becomes ``RollgymError``."""
        if not isinstance(data, dict):
            raise TypeError(f"error record must be a JSON object, got {type(data).__name__}")
        klass = _REGISTRY.get(str(data.get("type")), RollgymError)
        origin = data.get("origin")
        retryable = data.get("retryable")
        attempts = _opt_int(data.get("attempts"))
        body = data.get("body")
        return klass(
            str(data.get("message") or ""),
            status=_opt_int(data.get("status")),
            body=body if isinstance(body, str) else None,
            truncated=bool(data.get("truncated", False)),
            url=_opt_str(data.get("url")),
            method=_opt_str(data.get("method")),
            server=_opt_str(data.get("server")),
            endpoint=_opt_str(data.get("endpoint")),
            attempts=1 if attempts is None else attempts,
            # A record without the key gets the class default (a connect error stays retryable).
            retryable=retryable if isinstance(retryable, bool) else None,
            origin=cls.from_dict(origin) if isinstance(origin, dict) else None,
            **{name: data[name] for name in klass.extra_fields if name in data},
        )

    def with_fields(self, **changes: Any) -> Self:
        """A copy with some fields replaced (e.g. the final ``attempts`` count); new values are
        bounded and redacted like the constructor's."""
        unknown = set(changes) - set(_FIELDS) - set(self.extra_fields)
        if unknown:
            raise TypeError(f"unknown error fields: {sorted(unknown)}")
        data = self.fields()
        data.update(changes)
        if "url" in changes:  # first, as in the constructor
            data["url"] = redact_url(data["url"])
        if "message" in changes:
            data["message"] = bound_message(data["message"])
        if "body" in changes:
            data["body"], cut = bound_body(data["body"])
            data["truncated"] = bool(data["truncated"]) or cut
        if "origin" in changes:
            data["origin"] = _capped(_as_origin(data["origin"]), ORIGIN_DEPTH - 1)
        if set(changes) & set(self.extra_fields):
            type(self)._bound_extras(data)
        return _restore(type(self), data)  # type: ignore[no-any-return]

    @classmethod
    def _bound_extras(cls, data: dict[str, Any]) -> None:
        """Bound and check the ``extra_fields`` values in ``data`` in place, as the
        constructor does (``with_fields``)."""

    def root(self) -> RollgymError:
        """The error of the server where the failure started: follows ``origin`` while it names
        another server (a gateway's 502 -> the model's 500), but not into a cause recorded by
        the same server (a deadline's last read timeout)."""
        err: RollgymError = self
        while err.origin is not None and _started_upstream(err.type, err.server, err.origin.server):
            err = err.origin
        return err

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_dict() == other.to_dict()

    __hash__ = Exception.__hash__

    def __str__(self) -> str:
        where = " ".join(
            p
            for p in (
                f"[{self.server}]" if self.server else "",
                f"{self.method} {self.endpoint}" if self.method and self.endpoint else "",
                f"-> {self.status}" if self.status is not None else "",
                f"after {self.attempts} attempts" if self.attempts > 1 else "",
            )
            if p
        )
        text = f"{self.message} ({where})" if where else self.message
        if self.origin is not None:
            text += f"; caused by: {self.origin}"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status!r}, server={self.server!r})"


def _capped(err: RollgymError | None, depth: int) -> RollgymError | None:
    """``err``'s chain cut to ``depth`` errors (a copy only when it is longer)."""
    if err is None:
        return None
    if depth <= 0:
        return None
    node: RollgymError | None = err
    for _ in range(depth):
        if node is None:
            return err  # short enough: the usual case, nothing copied
        node = node.origin
    if node is None:
        return err
    # Too deep: rebuild the kept part, its last error without an origin.
    kept: list[RollgymError] = []
    node = err
    while node is not None and len(kept) < depth:
        kept.append(node)
        node = node.origin
    origin: RollgymError | None = None
    for item in reversed(kept):
        fields = item.fields()
        fields["origin"] = origin
        origin = _restore(type(item), fields)
    return origin


def root_record(record: dict[str, Any]) -> dict[str, Any]:
    """``RollgymError.root`` on an error's JSON form (``to_dict``, as ``failures.jsonl`` holds
    it): the record of the error where the failure started, read without rebuilding the chain
    (a record of a type this tree does not know keeps its own ``type``)."""
    while isinstance(origin := record.get("origin"), dict) and _started_upstream(
        record.get("type"), record.get("server"), origin.get("server")
    ):
        record = origin
    return record


def _started_upstream(type_: object, server: object, origin_server: object) -> bool:
    """Whether the root of a failure lies past an error (of ``type_``, recorded by ``server``)
    in its origin (recorded by ``origin_server``): the origin is another server's, or the error
    is a status answer, whose origin is the error the answering server reported itself."""
    klass = _REGISTRY.get(type_, RollgymError) if isinstance(type_, str) else RollgymError
    return origin_server != server or issubclass(klass, HTTPStatusError)


CONTEXT_TYPES = frozenset(
    {"rollgym_error", "http_status", "deadline_exceeded", "budget_exhausted", "circuit_open",
     "run_aborted"}
)  # fmt: skip
"""Error types that are context when they have an ``origin``: they pass a failure on or say
what stopped it, and the origin names the cause (``root_cause``)."""
ENDING_TYPES = frozenset({"deadline_exceeded", "budget_exhausted", "circuit_open", "run_aborted"})
"""The context types worth naming beside a cause: the deadline, budget or breaker that ended
the failure (``http_status`` and ``rollgym_error`` only pass it along)."""
CAUSE_TYPES = frozenset(
    {"config_error", "input_error", "invalid_request", "request_too_large", "bad_checkpoint",
     "capacity_reached", "protocol_error", "unparseable_verdict", "token_data",
     "transport_error", "connect_error", "session_lost", "connection_lost", "read_timeout",
     "replica_down", "replica_stalled", "answer_too_large", "paused_too_long", "waited_too_long",
     "rollout_error", "verifier_error",
     "stale_rollout", "environment_failure", "internal_error", "sandbox_error", "scorer_error",
     "weights_not_restored", "launch_error", "container_error", "image_build_error"}
)  # fmt: skip
"""Error types that are a cause wherever they are in a chain (``root_cause``)."""


class RootCause(NamedTuple):
    """What a failure is counted by: ``type``, the type of its cause, and ``context``, the
    deadline, budget or breaker that ended it (an ``ENDING_TYPES`` type), or None."""

    type: str
    context: str | None


def root_cause(error: RollgymError | dict[str, Any]) -> RootCause:
    """The root cause of a failure (an error, or its JSON form as ``failures.jsonl`` holds it):
    the deepest error of its ``origin`` chain that is a cause, with the outermost deadline,
    budget or breaker above it as context. The one rule every count of failures by cause uses
    (run summary, ``metrics.json``'s ``by_root``, ``run.json``'s abort, ``rollgym health``,
    ``rollgym report``, Prometheus).

    - Context (``CONTEXT_TYPES``), when it has an origin: ``http_status`` (a server's status
      answer passing on its upstream's error: a gateway's 502, a proxy's 504),
      ``budget_exhausted`` (a retry refused: the origin is the failure it would have retried),
      ``circuit_open`` (a call refused: the origin is the call's own last failure, else the
      failure that opened the breaker), ``deadline_exceeded`` (time ran out after the origin
      failed), ``run_aborted`` and ``rollgym_error`` (a plain wrapper, or a foreign exception's
      text). Without an origin such an error is its own cause: a 500 with no rollgym error
      behind it is an ``http_status``, a rollout deadline a ``deadline_exceeded``.
    - Causes (``CAUSE_TYPES``): every other type of the tree (``connect_error``,
      ``read_timeout``, ``replica_down``, ``internal_error``, ...). A cause with an origin
      of its own (a ``session_lost`` whose replica refused the connection) yields to a cause
      deeper in the chain.
    - A type this tree does not know (a newer rollgym's) is a cause, and keeps its name.

    A test holds every type of the tree to exactly one of the two sets."""
    context: str | None = None
    cause: str | None = None
    node: Any = error
    last = "unknown"
    for _ in range(ORIGIN_DEPTH + 1):
        if isinstance(node, RollgymError):
            kind: Any = node.type
            origin: Any = node.origin
        elif isinstance(node, dict):
            kind, origin = node.get("type"), node.get("origin")
        else:
            break
        last = kind if isinstance(kind, str) else "unknown"
        if last in CONTEXT_TYPES:
            if context is None and last in ENDING_TYPES and cause is None:
                context = last
        else:
            cause = last
        node = origin
    if cause is None:  # only context: the deepest one is the cause
        cause = last
        context = None if context == cause else context
    return RootCause(cause, context)


def is_known_type(name: object) -> bool:
    """Whether ``name`` is the ``type`` of a class in this tree."""
    return isinstance(name, str) and name in _REGISTRY


def _restore(klass: type[RollgymError], fields: dict[str, Any]) -> Any:
    err = klass.__new__(klass)
    Exception.__init__(err, fields["message"])
    for name, value in fields.items():
        setattr(err, name, value)
    return err


_FIELDS = (
    "message", "status", "body", "truncated", "url", "method", "server", "endpoint",
    "attempts", "retryable", "origin",
)  # fmt: skip

_SAYS: defaultdict[str, Callable[[Any], bool]] = defaultdict(
    lambda: lambda value: True, truncated=bool, attempts=lambda n: n != 1
)
"""Whether a field's value (not None) says something a record must keep (``to_record``): a
``truncated`` false and a single attempt are what ``from_dict`` assumes."""


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _as_origin(origin: Any) -> RollgymError | None:
    # A foreign exception (aiohttp's, say) may hold objects that do not pickle: keep only its
    # type name and text, as a plain record.
    if origin is None or isinstance(origin, RollgymError):
        return origin
    if isinstance(origin, BaseException):
        return RollgymError(f"{type(origin).__name__}: {origin}")
    raise TypeError(f"origin must be a RollgymError, not {type(origin).__name__}")


class ConfigError(RollgymError):
    """A config file, CLI option or input file is wrong; the message names the file and key."""

    type = "config_error"


class InputError(ConfigError):
    """One line of a task file is malformed; the message names the file and line."""

    type = "input_error"


class InvalidRequest(RollgymError):
    """A request to a rollgym server is malformed: bad JSON, wrong fields, too large."""

    type = "invalid_request"


class RequestTooLarge(InvalidRequest):
    """A request past one of the server's limits (its body, its headers, a session's state):
    answered 413 or 431; the message names the limit and the option that raises it."""

    type = "request_too_large"


class BadCheckpoint(InvalidRequest):
    """Weights a trainer asked to push are missing, are not a checkpoint directory
    (``config.json`` and ``*.safetensors``), or do not match the served model's parameter
    names, shapes or dtypes. Refused before anything was sent: the server serves on."""

    type = "bad_checkpoint"


class HTTPStatusError(RollgymError):
    """A server answered with a non-2xx status."""

    type = "http_status"


class CapacityReached(HTTPStatusError):
    """A server that holds a bounded number of sessions (OpenEnv's ``max_concurrent_envs``)
    refused a new one: it is full, not broken. Status 503, so the called server's policy
    (``retry_statuses``) decides whether and how often it is tried again."""

    type = "capacity_reached"


class ProtocolError(RollgymError):
    """A server answered 2xx but the body is not what the protocol promises."""

    type = "protocol_error"


class UnparseableVerdict(ProtocolError):
    """A judge model answered, but no verdict could be read from its answer."""

    type = "unparseable_verdict"


class TokenDataError(ProtocolError):
    """A rollout's token data cannot be turned into a trainer sample: a model call without
    token ids, ids or logprobs that are malformed, or a call whose prompt does not extend the
    ones before it where the caller asked for one sequence. Never repaired by re-tokenizing."""

    type = "token_data"


class TransportError(RollgymError):
    """No usable answer came back."""

    type = "transport_error"


class ConnectError(TransportError):
    """The connection could not be made, so nothing was sent: always safe to retry."""

    type = "connect_error"
    default_retryable = True


class SessionLost(ConnectError):
    """A call bound to one replica (its session lives there: a tool call, ``/verify``) found
    that replica gone. Nothing was sent, but no other replica has the session: not retried."""

    type = "session_lost"
    default_retryable = False


class ConnectionLost(TransportError):
    """The connection broke after the request was (maybe) sent: replay only if idempotent."""

    type = "connection_lost"


class ReadTimeout(TransportError):
    """No answer within the per-attempt timeout."""

    type = "read_timeout"


class ReplicaDown(ReadTimeout):
    """A model replica watched by a proxy (``rollgym.models.liveness``) failed its liveness
    probe (no answer in time, refused, 5xx): every call in flight there failed at once and its
    circuit opened. Not retried on that replica; another replica may take the call."""

    type = "replica_down"


class ReplicaStalled(ReplicaDown):
    """A watched model replica answers its probe, but its engine generated no token for
    ``stall_timeout`` seconds while it had calls in flight (its counters at ``/metrics``)."""

    type = "replica_stalled"


class AnswerTooLarge(TransportError):
    """An answer past one of the caller's limits (body, decompressed body, headers): read no
    further and never retried. The message names the limit and the option that raises it."""

    type = "answer_too_large"


class DeadlineExceeded(TransportError):
    """The total deadline ran out (of one call across its attempts, or of a whole rollout)."""

    type = "deadline_exceeded"


class WaitedTooLong(DeadlineExceeded):
    """A deadline that ran out before the work began (it waited for a free worker): the
    server's load, never its input's doing. Its own wire type, so a failure record tells
    "never got a worker" from a deadline that ran out while the work ran."""

    type = "waited_too_long"


class PausedTooLong(DeadlineExceeded):
    """A model call held by a pause (``/rollgym/pause``) that no resume released within the
    pause's deadline: the trainer that paused never resumed."""

    type = "paused_too_long"


class BudgetExhausted(RollgymError):
    """The called server's retry budget refused another retry of a transient failure."""

    type = "budget_exhausted"


class CircuitOpen(RollgymError):
    """The called server's circuit breaker is open: the request was not sent."""

    type = "circuit_open"


class RolloutError(RollgymError):
    """The rollout could not finish for a reason of its own (e.g. it ran out of steps)."""

    type = "rollout_error"


class StaleRollout(RollgymError):
    """The rollout's oldest model call ran more than ``max_staleness`` policy versions behind
    the live weights: cancelled in flight (its next model call is refused, 409) or discarded on
    arrival. An outcome of asynchronous training, never counted against a failure budget."""

    type = "stale_rollout"


class InternalError(RollgymError):
    """An unexpected exception inside a rollgym server (a bug, or an environment's own code)."""

    type = "internal_error"


class SandboxError(InternalError):
    """An environment's sandbox could not run the program (not the program's own failure)."""

    type = "sandbox_error"


class ContainerError(SandboxError):
    """A container provider failed a call (create, exec, copy, snapshot): podman's exit code is
    ``status``, its stderr the ``body``, the verb the ``endpoint``; translated in one place
    (``rollgym.containers.podman.translate``). Never the program's own failure."""

    type = "container_error"


class ImageBuildError(ContainerError):
    """A task's image cannot be built here (an unknown ``FROM``, a ``RUN`` that fails, no
    registry, a build past its deadline): the message names the Dockerfile and its line."""

    type = "image_build_error"


class ScorerError(InternalError):
    """An environment's scorer (a dataset's own code) cannot score a row: it raises on the
    row's own reference answer too, or its worker died on it. Not the answer's doing."""

    type = "scorer_error"


class VerifierError(InternalError):
    """A container task's verifier ran but left no reward that can be read (no reward file, an
    empty or unparseable one, a non-finite value) or did not finish in its time: never a 0."""

    type = "verifier_error"


class EnvironmentFailure(RollgymError):
    """An Environment Server (NeMo Gym 0.7) answered an episode with a handled failure
    (``EpisodeFailure``): its ``failure_reason`` is the message, and it keeps what it says of it.

    - ``terminal``: the environment says the episode must not be tried again; ``retryable``
      is ``not terminal`` unless given;
    - ``stage``: where it failed (``admission``, ``seed``, ``agent``, ``verification``,
      ``cleanup``), or None;
    - ``failure_kind``: the name of what went wrong, as the environment gave it, or None;
    - ``partial_response``: the response the agent had made so far (JSON), or None; past
      ``PARTIAL_LIMIT`` bytes it is dropped and the error flagged ``truncated``.

    The dialect's ``failures.error_from_failure`` makes one from the failure's JSON and checks
    it."""

    type = "environment_failure"
    extra_fields = (TERMINAL, STAGE, FAILURE_KIND, PARTIAL_RESPONSE)

    terminal: bool
    stage: str | None
    failure_kind: str | None
    partial_response: Any

    def __init__(
        self,
        message: str,
        *,
        terminal: bool = False,
        stage: str | None = None,
        failure_kind: str | None = None,
        partial_response: Any = None,
        retryable: bool | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(
            message, retryable=(not terminal) if retryable is None else retryable, **fields
        )
        data = {
            TERMINAL: terminal, STAGE: stage, FAILURE_KIND: failure_kind,
            PARTIAL_RESPONSE: partial_response, "truncated": self.truncated,
        }  # fmt: skip
        self._bound_extras(data)
        for name, value in data.items():
            setattr(self, name, value)

    @classmethod
    def _bound_extras(cls, data: dict[str, Any]) -> None:
        data[TERMINAL] = bool(data[TERMINAL])
        data[STAGE] = _opt_str(data[STAGE])
        data[FAILURE_KIND] = _opt_str(data[FAILURE_KIND])
        partial = _plain_json(data[PARTIAL_RESPONSE])
        if partial is _TOO_LARGE:
            partial = None
            data["truncated"] = True
        data[PARTIAL_RESPONSE] = partial


_TOO_LARGE = object()


def _plain_json(value: Any) -> Any:
    """``value`` as plain, redacted JSON data (a copy: no live object is kept); ``_TOO_LARGE``
    past ``PARTIAL_LIMIT`` bytes; None if it is no JSON at all."""
    if value is None:
        return None
    try:
        raw = orjson.dumps(value)
    except TypeError:
        return None
    if len(raw) > PARTIAL_LIMIT:
        return _TOO_LARGE
    # Redacted as text: the masks hold no quote or backslash, so the JSON stays JSON.
    try:
        return orjson.loads(redact_text(raw.decode()))
    except orjson.JSONDecodeError:
        return None


class WeightsNotRestored(RollgymError):
    """A weight push failed (``origin``: how) and the inference server could not be brought
    back to the weights it served before, or could not be unpaused: it may hold every request
    or have a broken engine. Restart it on the last good checkpoint."""

    type = "weights_not_restored"


class LaunchError(RollgymError):
    """A server process could not be started, or did not become healthy in time."""

    type = "launch_error"


class RunAborted(RollgymError):
    """The run-level failure budget stopped the run."""

    type = "run_aborted"


_REGISTRY[RollgymError.type] = RollgymError
ALL_ERRORS: tuple[type[RollgymError], ...] = tuple(_REGISTRY.values())


def chain_text(err: RollgymError) -> str:
    """``err``'s message and its causes' (``a: b: c``), each once: records keep each message once
    (a gateway's message holds only its own part), so a reader that does not follow ``origin``
    (a client's error body, NeMo RL's ``failure_reason``) is told the chain here."""
    parts: list[str] = []
    node: RollgymError | None = err
    while node is not None:
        if node.message and not any(node.message in part for part in parts):
            parts.append(node.message)
        node = node.origin
    return ": ".join(parts)


_ENVELOPE_KEYS = frozenset({"type", "status", "server", "retryable"})


def _bare_envelope(body: str | None) -> bool:
    """Whether ``body`` is only the error envelope a rollgym server answers a relayed failure
    with (``{"error": {"type", "status", "server", "retryable"}}``): nothing its ``origin``
    does not hold. Any other body, even a similar one, is kept."""
    if not body or not body.startswith('{"error":'):
        return False
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    inner = parsed.get("error") if isinstance(parsed, dict) and len(parsed) == 1 else None
    return isinstance(inner, dict) and set(inner) <= _ENVELOPE_KEYS
