"""What scores a rollout: an environment's fingerprint, taken once when its server starts.

A resources server answers ``GET /fingerprint`` (``FINGERPRINT_ENDPOINT``) with::

    {"id": "3f2a9c0d41be",              # short digest of all that follows
     "code": {"digest": ..., "files": {"rollgym/envs/math/server.py": sha256, ...}},
     "data": {"digest": ..., "files": {...}},
     "version": "1.2" | None,           # the class's declared ``version``
     "rollgym": "0.1.0"}

``code`` is the environment's own package, not all of Python: for each class of the server's
MRO below rollgym's server bases, the ``.py`` files of the folder of its module (a module of a
package: that package's folder, its subfolders included; a top-level module such as
``weather.py`` beside a config: that file alone). Files are named relative to the folder above
the package, so two checkouts of the same code give the same digest. ``data`` is the files its
``data_files()`` names (by default the non-Python files of the same folders: the bundled
environments keep theirs in ``data/``). The files are read at start, once: a module imported
lazily later is still counted (its file is in the folder), and a file edited or replaced under
the same name gives another digest, so two runs scored by different environments are told apart
(``compare``), naming what differs: code, data or version.

A Gymnasium-style server (``GymnasiumServer``) is fingerprinted as a resources server is. An
OpenEnv app that rollgym serves (``impl: openenv``) is no class of rollgym's: its ``code`` is
every ``.py`` file of the app's top-level package (its folder, or each folder of a namespace
package; a top-level module: that file alone), loaded or not: a scoring module the app
imports only at its first step is counted from the start, and an edit to it is seen. Only that
package is read, never the third-party packages it imports (an app that is itself an installed
package is read where it is installed). Its ``data`` is the non-Python files of the app
module's folder, its ``version`` that of the installed distribution that provides the package,
if any (``Fingerprint.of_app``). Every part is bounded: ``MAX_FILES`` files and ``MAX_BYTES``
bytes, past which it says ``truncated``.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.routing import Route

from rollgym.config import RetryPolicy
from rollgym.errors import ConfigError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.server.endpoint import Call, json_endpoint
from rollgym.server.provenance import file_sha256
from rollgym.version import __version__
from rollgym.wire import FINGERPRINT_ENDPOINT

ASK_TIMEOUT = 5.0
"""Seconds a server has to answer ``/fingerprint``: it informs, it never holds a run up."""
AGENT_ASK_TIMEOUT = 2 * ASK_TIMEOUT
"""Seconds an agent has: it asks each replica of its resources server for up to
``ASK_TIMEOUT`` first, so one replica slow to answer must not make the agent's whole answer
(the replicas that did say) arrive too late."""
REPLICAS_FIELD = "replicas"
"""In the answer for a server whose replicas answered different fingerprints: replica ->
its fingerprint (``agreed``)."""
ID_CHARS = 12
"""Hex digits of a fingerprint's short id: what every record carries."""
MAX_FILES = 2000
"""Files digested per part at most (a package folder holding a dataset of many files is cut
there, and says so with ``truncated``)."""
MAX_BYTES = 256 * 2**20
"""Bytes digested per part at most: a dataset of gigabytes in a package folder must not hold
the server's start up reading it (the part says ``truncated``)."""
_SKIP_DIRS = frozenset({"__pycache__", ".git", ".mypy_cache", ".pytest_cache", "node_modules"})
_BASES = frozenset({"rollgym.server.resources", "rollgym.server.base", "rollgym.server.gymnasium"})


@dataclass(frozen=True)
class Digested:
    """Files and their sha256 (by a stable relative name), and one digest over them."""

    files: dict[str, str]
    truncated: bool = False

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}\0{self.files[name]}\n".encode())
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"digest": self.digest, "files": dict(sorted(self.files.items()))}
        if self.truncated:
            out["truncated"] = True
        return out


NOT_A_FILE = "not a regular file"
"""The digest said of a FIFO, device or socket (or a link to one) among the files: never
read, as a FIFO's ``open`` waits for a writer for ever and a device's read never ends."""


def digest_files(paths: Iterable[tuple[str, Path]]) -> Digested:
    """``(name, path)`` pairs digested (an unreadable file's sha256 is ``"unreadable"``, one
    that is no regular file's ``NOT_A_FILE``), at most ``MAX_FILES`` files and ``MAX_BYTES``
    bytes."""
    files: dict[str, str] = {}
    read = 0
    for name, path in paths:
        try:
            mode = path.stat()
            regular, size = stat.S_ISREG(mode.st_mode), mode.st_size
        except OSError:
            regular, size = True, 0  # gone or unreadable: said so below, costs nothing
        if not regular:
            size = 0
        if len(files) >= MAX_FILES or read + size > MAX_BYTES:
            return Digested(files, truncated=True)
        read += size
        files[name] = (file_sha256(str(path)) or "unreadable") if regular else NOT_A_FILE
    return Digested(files)


def package_roots(klass: type) -> list[tuple[Path, Path]]:
    """(folder or file, the folder names are relative to) of each environment class in
    ``klass``'s MRO: rollgym's own server bases left out."""
    roots: list[tuple[Path, Path]] = []
    for cls in klass.__mro__:
        module = cls.__module__
        if module in _BASES or module == "builtins" or cls is object:
            continue
        found = module_root(module)
        if found is not None and all(found[0] != r for r, _ in roots):
            roots.append(found)
    return roots


def module_root(module: str) -> tuple[Path, Path] | None:
    """(folder or file, the folder names are relative to) of loaded ``module``: a package's
    folder, the folder of a package's module, or a top-level module's file alone."""
    file = getattr(sys.modules.get(module), "__file__", None)
    if not file:
        return None
    path = Path(os.path.realpath(file))
    depth = len(module.split("."))
    if path.name == "__init__.py":  # a package itself: its folder
        return path.parent, path.parent.parents[depth - 1]
    if depth > 1:  # a package's module: its folder
        return path.parent, path.parent.parents[depth - 2]
    return path, path.parent  # a top-level module: that file alone


def package_files(package: str) -> Iterator[tuple[str, Path]]:
    """Every ``.py`` file of loaded top-level ``package``, loaded or not, named relative to
    the folder above it, in a stable order: the package's folder (each of a namespace
    package's folders), or a top-level module's file alone."""
    module = sys.modules.get(package)
    file = getattr(module, "__file__", None)
    if file and Path(file).name != "__init__.py":  # a top-level module: that file alone
        path = Path(os.path.realpath(file))
        if path.suffix == ".py":
            yield path.name, path
        return
    # A package: its folder; a namespace package (OpenEnv's ``openenv init`` writes none
    # of ``__init__.py`` in some versions): each folder of its path.
    folders = [Path(file).parent] if file else list(getattr(module, "__path__", None) or [])
    seen: set[Path] = set()
    for folder in folders:
        root = Path(os.path.realpath(folder))
        if root in seen or not root.is_dir():
            continue
        seen.add(root)
        yield from _walk(root, root.parent, True)


def distribution_version(package: str) -> str | None:
    """The version of the installed distribution that provides top-level ``package``."""
    names = importlib.metadata.packages_distributions().get(package) or []
    for dist in names:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _walk(root: Path, base: Path, python: bool) -> Iterator[tuple[str, Path]]:
    """The files under ``root``, in a stable order, lazily: a digest that stops at
    ``MAX_FILES`` stops the walk of a large folder there too."""
    if root.is_file():
        if python:
            yield (root.relative_to(base).as_posix(), root)
        return
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")) or name.startswith("."):
                continue
            if name.endswith(".py") == python:
                path = Path(folder) / name
                yield (path.relative_to(base).as_posix(), path)


def code_files(klass: type) -> Iterator[tuple[str, Path]]:
    """The ``.py`` files of ``klass``'s environment packages (see the module docstring)."""
    for root, base in package_roots(klass):
        yield from _walk(root, base, True)


def default_data_files(klass: type) -> Iterator[tuple[str, Path]]:
    """The non-Python files of the same folders (``data/``, a YAML config...)."""
    for root, base in package_roots(klass):
        yield from _walk(root, base, False)


@dataclass(frozen=True)
class Fingerprint:
    """An environment's fingerprint (see the module docstring)."""

    code: Digested
    data: Digested
    version: str | None
    rollgym: str = __version__

    @property
    def id(self) -> str:
        h = hashlib.sha256()
        parts = (self.code.digest, self.data.digest, self.version or "", self.rollgym)
        h.update("\0".join(parts).encode())
        return h.hexdigest()[:ID_CHARS]

    @classmethod
    def of(
        cls,
        klass: type,
        data: Iterable[tuple[str, Path]] | None = None,
        version: str | None = None,
    ) -> Fingerprint:
        """``klass``'s fingerprint now; ``data``: its data files (default: its folders')."""
        files = default_data_files(klass) if data is None else data
        return cls(digest_files(code_files(klass)), digest_files(files), version)

    @classmethod
    def of_app(cls, module: str) -> Fingerprint:
        """The fingerprint of an app that is no rollgym class (an OpenEnv app), from its
        ``module`` (see the module docstring)."""
        package = module.partition(".")[0]
        found = module_root(module)
        data = _walk(*found, False) if found is not None else iter(())
        return cls(
            digest_files(package_files(package)), digest_files(data), distribution_version(package)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "code": self.code.to_dict(),
            "data": self.data.to_dict(),
            "version": self.version,
            "rollgym": self.rollgym,
        }


def fingerprint_route(fingerprint: Fingerprint) -> Route:
    """``GET /fingerprint`` (``POST`` too) answering ``fingerprint``, taken once already."""
    answer = fingerprint.to_dict()

    async def answered(body: Any, call: Call) -> Any:
        return answer

    return Route(FINGERPRINT_ENDPOINT, json_endpoint(answered), methods=["GET", "POST"])


PARTS = ("code", "data", "version", "rollgym")
"""What a fingerprint is made of, in the order a difference is named."""


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two recorded fingerprints (``Fingerprint.to_dict``), each named
    with its files or values: ``["code: server.py changed", "version: 1 -> 2"]``. Empty when
    the same environment scored both."""
    out: list[str] = []
    for part in PARTS:
        one, two = a.get(part), b.get(part)
        if isinstance(one, dict) and isinstance(two, dict):
            if one.get("digest") == two.get("digest"):
                continue
            out.append(f"{part}: {_files_changed(one.get('files'), two.get('files'))}")
        elif one != two:
            out.append(f"{part}: {one!r} -> {two!r}")
    return out


def _files_changed(one: Any, two: Any) -> str:
    if not isinstance(one, dict) or not isinstance(two, dict):
        return "differs"
    changed = sorted(n for n in one.keys() & two.keys() if one[n] != two[n])
    gone = sorted(one.keys() - two.keys())
    new = sorted(two.keys() - one.keys())
    said = [f"{n} changed" for n in changed] + [f"{n} removed" for n in gone]
    said += [f"{n} added" for n in new]
    if not said:
        return "differs"
    more = f" (and {len(said) - 5} more)" if len(said) > 5 else ""
    return ", ".join(said[:5]) + more


# -- asking the replicas of a server ------------------------------------------------------------


async def ask_fingerprint(
    client: HttpClient, name: str, url: str, timeout: float = ASK_TIMEOUT
) -> dict[str, Any]:
    """The fingerprint server ``name`` at ``url`` answers (a rollgym agent answers its
    resources server's: ask it with ``AGENT_ASK_TIMEOUT``), or ``{"id": None, "unknown":
    why}``; asked once, for at most ``timeout`` seconds, never raising."""
    once = RetryPolicy(max_attempts=1, attempt_timeout=timeout)
    target = Target.single(f"{name}.fingerprint", url, once)
    try:
        said: Any = await client.call(target, FINGERPRINT_ENDPOINT, {}, deadline=timeout)
    except RollgymError as err:
        return {"id": None, "unknown": f"no /fingerprint ({err.type}: {err.message[:200]})"}
    if not isinstance(said, dict):
        return {"id": None, "unknown": "its /fingerprint answer is no object"}
    if _usable_id(said.get("id")):
        return said
    replicas = said.get(REPLICAS_FIELD)
    if (
        isinstance(replicas, dict)
        and replicas
        and all(isinstance(fp, dict) and _usable_id(fp.get("id")) for fp in replicas.values())
    ):
        return said  # an agent's word that its resources server's replicas differ (``agreed``)
    if said.get("id") is None and isinstance(said.get("unknown"), str):
        return {"id": None, "unknown": said["unknown"][:500]}  # an agent's, passed on
    return {"id": None, "unknown": "its /fingerprint answer names no id"}


MAX_ID_CHARS = 64
"""The longest fingerprint id taken from an answer (rollgym's are ``ID_CHARS``): every record
line carries it, so a foreign server's ``/fingerprint`` route must not put a megabyte there."""


def _usable_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS


async def ask_replicas(
    client: HttpClient, name: str, urls: Sequence[str], timeout: float = ASK_TIMEOUT
) -> tuple[dict[str, Any], list[str]]:
    """Every replica of server ``name`` (at ``urls``) asked for its fingerprint, at once (for
    at most ``timeout`` seconds: ``ask_fingerprint``); their one fingerprint and warnings
    (``agreed``)."""
    said = await asyncio.gather(*(ask_fingerprint(client, name, url, timeout) for url in urls))
    labels = [f"{name} replica {i} ({url})" for i, url in enumerate(urls)]
    return agreed(name, list(zip(labels, said, strict=True)))


def agreed(
    name: str, answers: Sequence[tuple[str, dict[str, Any]]]
) -> tuple[dict[str, Any], list[str]]:
    """The one fingerprint of server ``name`` from its replicas' answers (label, answer), and
    warnings naming a replica that gave none.

    Replicas that all answer one id: that fingerprint. Some unknown: the known one, each
    unknown replica named in a warning (whether it differs cannot be told). None known: the
    first answer (unknown, with why). Known ids that differ, or an answer that is itself such
    a mix (an agent whose resources server's replicas differ): ``{"id": None, "unknown": why,
    "replicas": {label: fingerprint}}``, never one of them picked: ``refuse_mixed`` turns it
    into the error that stops a run or stream before it starts."""
    known: dict[str, dict[str, Any]] = {}
    unknown: list[tuple[str, dict[str, Any]]] = []
    for label, said in answers:
        inner = said.get(REPLICAS_FIELD)
        if isinstance(inner, dict):  # already a mix, a level down: its replicas, named
            known.update({f"{label} -> {sub}": fp for sub, fp in inner.items()})
        elif isinstance(said.get("id"), str):
            known[label] = said
        else:
            unknown.append((label, said))
    warnings = [
        f"server {name}: {label}: {said.get('unknown')}: whether it scores as the other "
        "replicas do cannot be told"
        for label, said in unknown
        if known
    ]
    if not known:
        return (answers[0][1] if answers else {"id": None, "unknown": "no replica"}), warnings
    ids = {fp["id"] for fp in known.values()}
    if len(ids) == 1:
        return next(iter(known.values())), warnings
    said_ids = ", ".join(f"{label} fingerprint {fp['id']}" for label, fp in known.items())
    return {
        "id": None,
        "unknown": f"its replicas are scored by different environments: {said_ids}",
        REPLICAS_FIELD: known,
    }, warnings


def refuse_mixed(name: str, fingerprint: dict[str, Any]) -> None:
    """Raise ``ConfigError`` when ``fingerprint`` (``agreed``) says the replicas of server
    ``name`` are scored by different environments, naming them and what differs: rewards from
    two environments mixed in one run, one stamp on every record, would be silently wrong."""
    replicas = fingerprint.get(REPLICAS_FIELD)
    if not isinstance(replicas, dict):
        return
    (first, one), *rest = replicas.items()
    diffs = [
        f"{label} against {first}: {'; '.join(differences(one, fp)) or 'differs'}"
        for label, fp in rest
        if fp.get("id") != one.get("id")
    ]
    raise ConfigError(
        f"server {name}: {fingerprint.get('unknown')} ({'; '.join(diffs)}). Their rewards "
        "would be mixed in one run under one fingerprint: start every replica from the same "
        "code and data (a replica left running from an older checkout, a file edited between "
        "two starts), or name them as two servers"
    )
