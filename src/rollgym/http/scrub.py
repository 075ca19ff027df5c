"""Keep a request's credentials out of the errors its answer produced.

The shared redaction in ``rollgym.errors`` masks what looks like a key (``Bearer ...``,
``sk-...``) and the credentials this process saw in a URL; a server may echo the key this
request carried in any other form, so that key is replaced too, in every form it may be echoed
in (percent-encoded, JSON-escaped, base64; a ``Basic`` header's user:password decoded), in a copy
of the error and of every origin.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from urllib.parse import quote

from rollgym.credentials import echo_forms
from rollgym.errors import RollgymError

SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
)
_MIN_SECRET = 6  # shorter values would blank out ordinary words


def header_secrets(headers: Mapping[str, str] | None) -> tuple[str, ...]:
    """Credential values ``headers`` carry, longest first (a token before a prefix of it)."""
    if not headers:
        return ()
    out: set[str] = set()
    for name, value in headers.items():
        if name.lower() in SECRET_HEADERS and value:
            out.add(value)
            scheme, _, token = value.strip().rpartition(" ")  # "Bearer KEY" -> KEY
            if len(token) >= _MIN_SECRET:
                out.add(token)
                out.update(echo_forms(quote(token, safe=""), None))
            if scheme.lower() == "basic":
                out.update(_basic_forms(token))
    return tuple(sorted(out, key=len, reverse=True))


def _basic_forms(token: str) -> set[str]:
    """The echo forms of the user:password a ``Basic`` token encodes."""
    try:
        pair = base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return set()
    user, _, password = pair.partition(":")
    return echo_forms(quote(user, safe=""), quote(password, safe=""))


def scrubbed(err: RollgymError, secrets: tuple[str, ...]) -> RollgymError:
    """A copy of ``err`` (and of its origins) with every one of ``secrets`` replaced; ``err``
    itself when there are none."""
    if not secrets:
        return err
    origin = None if err.origin is None else scrubbed(err.origin, secrets)
    return err.with_fields(
        message=_without(err.message, secrets),
        body=_without(err.body, secrets),
        url=_without(err.url, secrets),
        origin=origin,
    )


def _without(text: str | None, secrets: tuple[str, ...]) -> str | None:
    if text is None:
        return None
    for secret in secrets:
        text = text.replace(secret, "REDACTED")
    return text
