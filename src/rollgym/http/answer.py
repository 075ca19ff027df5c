"""What a server's answer means: a 2xx is its decoded JSON, anything else a failed attempt.

A failed attempt carries what the retry decision needs besides the error: the seconds the
server asked us to wait (``Retry-After``) and whether a rollgym error body declared itself final.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias

import orjson

from rollgym.errors import HTTPStatusError, ProtocolError, RollgymError, is_known_type
from rollgym.http.policy import parse_retry_after
from rollgym.http.sse import parse_events
from rollgym.http.translate import translate
from rollgym.http.transport import RawAnswer

JsonValue: TypeAlias = "dict[str, JsonValue] | list[JsonValue] | str | int | float | bool | None"
"""Any JSON value, as ``orjson.loads`` returns it."""


class AttemptFailed(Exception):
    """One attempt without a usable answer (internal to the client's retry loop)."""

    def __init__(
        self, error: RollgymError, retry_after: float | None = None, *, final: bool = False
    ) -> None:
        super().__init__(error)
        self.error = error
        self.retry_after = retry_after
        self.final = final


class Streamed(NamedTuple):
    """A streamed answer: the ``data`` of its events (``data: [DONE]`` seen), or ``whole``, the
    JSON object a server that does not stream answered instead."""

    events: list[Any]
    whole: dict[str, Any] | None = None


def read_object(answer: RawAnswer, server: str, url: str, endpoint: str) -> Any:
    return read_answer(answer, server, url, endpoint, True)


def read_value(answer: RawAnswer, server: str, url: str, endpoint: str) -> Any:
    return read_answer(answer, server, url, endpoint, False)


def read_answer(answer: RawAnswer, server: str, url: str, endpoint: str, want_object: bool) -> Any:
    """The JSON of a 2xx ``answer`` (an object if ``want_object``), or ``AttemptFailed``."""
    status, raw = answer.status, answer.body
    if status >= 400:
        raise _status_failure(answer, server, url, endpoint)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        err = translate(exc, server=server, method="POST", url=url, endpoint=endpoint, timeout=0)
        # Through with_fields, so the body is bounded and redacted like any other.
        raise AttemptFailed(err.with_fields(status=status, body=raw)) from exc
    if want_object and not isinstance(value, dict):
        err = ProtocolError(
            f"{server} answered POST {endpoint} with a JSON {type(value).__name__}, not an object",
            status=status, body=raw, url=url, method="POST", server=server, endpoint=endpoint,
        )  # fmt: skip
        raise AttemptFailed(err)
    return value


def read_stream(answer: RawAnswer, server: str, url: str, endpoint: str) -> Streamed:
    """The events of a 2xx server-sent-events ``answer``, or ``AttemptFailed``. A stream cut
    before ``data: [DONE]`` or carrying an ``{"error": ...}`` event (a server that failed after
    it had answered 200, as vLLM does) is a failed attempt; a plain JSON object is ``whole``."""
    status, raw = answer.status, answer.body
    if status >= 400:
        raise _status_failure(answer, server, url, endpoint)
    if raw[:64].lstrip()[:1] == b"{":
        return Streamed([], read_answer(answer, server, url, endpoint, True))
    where: dict[str, Any] = {"server": server, "url": url, "endpoint": endpoint, "method": "POST"}
    try:
        events = parse_events(raw)
    except ValueError as exc:
        err = translate(exc, timeout=0, **where)
        raise AttemptFailed(err.with_fields(status=status, body=raw)) from exc
    for event in events.data:
        if isinstance(event, dict) and isinstance(event.get("error"), dict):
            raise AttemptFailed(_stream_error(event, **where), final=_declared_final(raw))
    if not events.done:
        # No [DONE]: the server stopped mid-answer; what came is not the whole answer.
        err = ProtocolError(
            f"{server}'s stream on POST {endpoint} ended before 'data: [DONE]'",
            status=status, body=raw[-2048:], **where,
        )  # fmt: skip
        raise AttemptFailed(err)
    return Streamed(events.data)


def _stream_error(event: dict[str, Any], **where: Any) -> HTTPStatusError:
    inner = event["error"]
    code = inner.get("code")
    # The status it would have answered had it not started streaming (vLLM puts it in code).
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    message = f"{where['server']} sent an error event in its stream on POST {where['endpoint']}"
    if inner.get("message"):
        message += f": {inner['message']}"
    return HTTPStatusError(message, status=status, body=orjson.dumps(event), **where)


def _status_failure(answer: RawAnswer, server: str, url: str, endpoint: str) -> AttemptFailed:
    return AttemptFailed(
        status_error(server, url, endpoint, answer.status, answer.body),
        parse_retry_after(answer.retry_after),
        final=_declared_final(answer.body),
    )


def status_error(server: str, url: str, endpoint: str, status: int, raw: bytes) -> HTTPStatusError:
    """An ``HTTPStatusError`` from a non-2xx answer; a rollgym error body becomes the origin.

    Each fact is kept once: what the origin holds is cut from the message (a gateway's
    ``model failed: <the model's message>`` leaves ``model failed``) and from the body (kept as
    the rollgym error body without its ``origin``, and without its ``message`` when that was
    cut), so a record does not grow by a copy of its chain at every hop. A server's own typed
    error (no origin of its own) becomes the origin and is kept as it came."""
    message = f"{server} answered {status} on POST {endpoint}"
    origin: RollgymError | None = None
    body: bytes | None = raw
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        inner = data["error"]
        text = inner.get("message")
        if isinstance(inner.get("origin"), dict):
            origin = RollgymError.from_dict(inner["origin"])
            own = _own_part(text, origin)
            # What the record holds already leaves the body: the origin, and the message once
            # it is cut to its own part (the rest is the origin's).
            held = ("origin", "message") if own != text else ("origin",)
            text = own
            body = orjson.dumps(
                {**data, "error": {k: v for k, v in inner.items() if k not in held}}
            )
        elif is_known_type(inner.get("type")) and inner.get("type") != "http_status":
            # The server's own typed error (a verify deadline, a crash): keep it as the cause.
            # Its message stays in ours too: callers show it (a tool's refusal, to the model).
            origin = RollgymError.from_dict(inner)
        if text:
            message += f": {text}"
    elif isinstance(data, dict) and isinstance(data.get("detail"), (str, list)):
        message += f": {str(data['detail'])[:300]}"
    return HTTPStatusError(
        message, status=status, body=body, url=url, method="POST", server=server,
        endpoint=endpoint, origin=origin,
    )  # fmt: skip


def _own_part(text: object, origin: RollgymError) -> str | None:
    """A gateway's message without what its ``origin`` says already: rollgym servers write
    ``<server> failed: <the origin's message and causes>``; the part before the origin's own
    message is the gateway's. A message that does not hold the origin's is kept whole."""
    if not isinstance(text, str):
        return None
    at = text.find(origin.message) if origin.message else -1
    if at < 0:
        return text
    return text[:at].rstrip(": ") or None


def _declared_final(raw: bytes) -> bool:
    """Whether a rollgym error body says ``"retryable": false`` (only rollgym servers say so)."""
    if b'"retryable"' not in raw:
        return False
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    inner = data.get("error") if isinstance(data, dict) else None
    return isinstance(inner, dict) and inner.get("retryable") is False
