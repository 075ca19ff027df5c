"""What a server's answer means: a 2xx is its decoded JSON, anything else a failed attempt.

A failed attempt carries what the retry decision needs besides the error: the seconds the
server asked us to wait (``Retry-After``) and whether a rollgym error body declared itself final.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import orjson

from rollgym.errors import HTTPStatusError, ProtocolError, RollgymError, is_known_type
from rollgym.http.policy import parse_retry_after
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


def read_answer(answer: RawAnswer, server: str, url: str, endpoint: str, want_object: bool) -> Any:
    """The JSON of a 2xx ``answer`` (an object if ``want_object``), or ``AttemptFailed``."""
    status, raw = answer.status, answer.body
    if status >= 400:
        raise AttemptFailed(
            status_error(server, url, endpoint, status, raw),
            parse_retry_after(answer.retry_after),
            final=_declared_final(raw),
        )
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


def status_error(server: str, url: str, endpoint: str, status: int, raw: bytes) -> HTTPStatusError:
    """An ``HTTPStatusError`` from a non-2xx answer; a rollgym error body becomes the origin."""
    message = f"{server} answered {status} on POST {endpoint}"
    origin: RollgymError | None = None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        inner = data["error"]
        if inner.get("message"):
            message += f": {inner['message']}"
        if isinstance(inner.get("origin"), dict):
            origin = RollgymError.from_dict(inner["origin"])
        elif is_known_type(inner.get("type")) and inner.get("type") != "http_status":
            # The server's own typed error (a verify deadline, a crash): keep it as the cause.
            origin = RollgymError.from_dict(inner)
    elif isinstance(data, dict) and isinstance(data.get("detail"), (str, list)):
        message += f": {str(data['detail'])[:300]}"
    return HTTPStatusError(
        message, status=status, body=raw, url=url, method="POST", server=server,
        endpoint=endpoint, origin=origin,
    )  # fmt: skip


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
