"""Credentials this process has seen in a URL, masked in every form an upstream may echo them.

A ``base_url`` such as ``http://user:p%40ss@gpu:8000/v1`` reaches its upstream as
``Authorization: Basic <base64 of user:p@ss>``; a badly-behaved upstream may echo that back in
its error body or headers as the bare password, the ``user:password`` pair (percent-encoded or
decoded, JSON-escaped), its base64 (standard or URL-safe, padded or not, alone or inside a
longer base64 run) or the whole URL. The shared redaction (``rollgym.errors.redact_text``) masks
each of those for every credential remembered here, so none reaches ``failures.jsonl``, a log, a
502 body or the terminal.

A credential is remembered when ``rollgym.errors.redact_url`` drops it from a URL (every error
and every config dump goes through it) and, in a server process, for every URL of the run's
config before the server starts (``remember_urls_in``).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, TextIO
from urllib.parse import quote, quote_plus, unquote, urlsplit

REDACTED = "REDACTED"
MIN_ALONE = 6
"""A password shorter than this is masked only with its user name (``user:pw``): alone, it would
blank out ordinary words."""
MIN_FRAGMENT = 12
"""The part of a base64 run that encodes the pair alone is masked from this many characters
(72 bits: no ordinary base64 run matches it by chance)."""
MAX_REMEMBERED = 32
"""Credentials remembered per process; later ones are not (the run's own come first). Error
records from other servers carry URLs too, and must not grow this without bound."""

_lock = threading.Lock()
_seen: set[tuple[str, str | None]] = set()
_forms: set[str] = set()
_pattern: re.Pattern[str] | None = None


def remember_url(url: str) -> None:
    """Remember the ``user:password`` of ``url``, if it carries one."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return
    if user is not None:
        remember(user, password)


def remember_urls_in(value: Any) -> None:
    """Remember the credentials of every URL in ``value`` (a config dump: dicts, lists)."""
    if isinstance(value, str):
        if "@" in value and "://" in value:
            remember_url(value)
    elif isinstance(value, dict):
        for item in value.values():
            remember_urls_in(item)
    elif isinstance(value, list):
        for item in value:
            remember_urls_in(item)


def remember(user: str, password: str | None) -> None:
    """Mask, from now on in this process, every echo form of ``user:password`` (as written in a
    URL: percent-encoded or not). A user without a password is itself the secret (a token)."""
    global _pattern
    key = (user, password)
    if key in _seen:
        return
    with _lock:
        if key in _seen or len(_seen) >= MAX_REMEMBERED:
            return
        _seen.add(key)
        _forms.update(echo_forms(user, password))
        ordered = sorted(_forms, key=len, reverse=True)  # at one position, the longest wins
        _pattern = re.compile("|".join(map(re.escape, ordered)), re.IGNORECASE)


def mask(text: str) -> str:
    """``text`` with every remembered credential, in any of its forms, replaced."""
    pattern = _pattern
    if pattern is None or not text:
        return text
    return pattern.sub(REDACTED, text)


def echo_forms(user: str, password: str | None) -> set[str]:
    """The strings that give ``user:password`` away, as an upstream may echo them."""
    name = unquote(user)
    secret = unquote(password) if password is not None else ""
    pair = f"{name}:{secret}"
    texts = {pair, f"{user}:{password or ''}"}
    texts.add(f"{quote(name, safe='')}:{quote(secret, safe='')}")
    texts.add(f"{quote_plus(name)}:{quote_plus(secret)}")
    alone = secret if password else name  # no password: the user is a token
    if len(alone) >= MIN_ALONE:
        texts.update({alone, password or user})
    for text in list(texts):
        texts.update({quote(text, safe=""), quote_plus(text)})
    forms = set(texts)
    for text in texts:
        forms.update(_json_forms(text))
    for raw in [pair] + ([alone] if len(alone) >= MIN_ALONE else []):
        forms.update(_base64_forms(raw.encode()))
    return {form for form in forms if form}


def _json_forms(text: str) -> Iterable[str]:
    yield json.dumps(text)[1:-1]
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    yield escaped
    yield escaped.replace("/", "\\/")  # encoders that escape the solidus


def _base64_forms(raw: bytes) -> Iterable[str]:
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode()
        yield whole
        yield whole.rstrip("=")
        # Inside a longer run, ``raw`` starts at one of three byte offsets (mod 3) from the
        # run's start; for each, the characters that encode ``raw``'s bits alone are the same
        # whatever surrounds it.
        for shift in range(3):
            run = encode(b"\0" * shift + raw).decode().rstrip("=")
            first = -(-shift * 8 // 6)  # the first character with no bit of the padding
            last = (shift + len(raw)) * 8 // 6  # past the last one with no bit of what follows
            fragment = run[first:last]
            if len(fragment) >= MIN_FRAGMENT:
                yield fragment


def remember_secret(value: str) -> None:
    """Mask, from now on in this process, every echo form of a bare secret (an API key)."""
    if len(value) >= MIN_ALONE:
        remember(quote(value, safe=""), None)


class MaskedStream:
    """A text stream that writes through ``redact`` (a server process's stdout and stderr: its
    log, whoever writes to it: logging, uvicorn's own handlers, a traceback)."""

    def __init__(self, inner: TextIO, redact: Callable[[str], str]) -> None:
        self._inner = inner
        self._redact = redact

    def write(self, text: str) -> int:
        self._inner.write(self._redact(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding...
        return getattr(self._inner, name)
