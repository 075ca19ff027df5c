"""Checks of command-line values that the commands share, each failing as a ``ConfigError``
that names the option."""

from __future__ import annotations

from urllib.parse import urlsplit

from rollgym.errors import ConfigError


def http_url(value: str, where: str) -> str:
    """``value`` if it is an http(s) URL with a host (a port, if any, in range)."""
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as exc:
        raise ConfigError(f"{where}: {value!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{where}: {value!r} is not an http(s) URL (expected e.g. http://127.0.0.1:8000)"
        )
    return value.strip().rstrip("/")
