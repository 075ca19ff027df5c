"""Which code a server runs: the file its class was loaded from, and a digest of that file.

A server says it in its ``/health`` answer (``code``), read where it runs, so the record is of
what was imported, not of what the collector would have found; the collector writes every
server's into ``run.json`` (``code``), so a run says which verifier scored it. That one file
only: what it imports is not digested (it is kept from being replaced by the import path,
``rollgym.import_path``), since a module imported at the first ``/verify`` would be missing
from a list taken at start.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

_CHUNK = 1 << 20


@dataclass(frozen=True)
class LoadedCode:
    """The ``impl:`` of a server as its config names it, the module of its class, that
    module's file (None for a class with no file, e.g. defined in ``__main__`` of a notebook)
    and the sha256 of the file's bytes when the server started."""

    impl: str | None
    module: str
    file: str | None
    sha256: str | None

    @classmethod
    def of(cls, klass: type, impl: str | None) -> LoadedCode:
        """What ``klass`` was loaded from (``impl``: the config's name for it)."""
        module = klass.__module__
        file = getattr(sys.modules.get(module), "__file__", None)
        if not file:
            return cls(impl, module, None, None)
        file = os.path.realpath(file)  # the file itself: no "..", no link in between
        return cls(impl, module, file, file_sha256(file))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> LoadedCode | None:
        """The record in a ``/health`` answer's ``code``; None when it holds none (a server
        that is not rollgym's, or one from before servers reported it)."""
        if not isinstance(data, dict) or not isinstance(data.get("module"), str):
            return None
        text = {key: data.get(key) for key in ("impl", "file", "sha256")}
        fields = {key: value if isinstance(value, str) else None for key, value in text.items()}
        return cls(module=data["module"], **fields)


def file_sha256(path: str) -> str | None:
    """The hex sha256 of the file at ``path``; None if it cannot be read (gone since)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as source:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()
