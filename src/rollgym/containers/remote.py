"""A remote container provider over a small JSON shape: how E2B, Modal, Daytona or a Kubernetes
sandbox service plugs in (one adapter server on their side, or this module's shape mapped onto
their SDK in a module like this one).

Every call is one ``POST <url>/sandboxes/<verb>`` with a JSON body, answered with JSON (errors
as any non-2xx status with a body):

==========  =====================================================  ================================
verb        body                                                   answer
==========  =====================================================  ================================
create      ``{"spec": {image, limits, lease, workdir, env,        ``{"id"}``
            labels}}`` (the labels carry the lease)
exec        ``{"id", "command", "timeout", "max_output",           ``ExecResult``'s fields
            "stdin" (base64 or null), "workdir", "env"}``
put         ``{"id", "dest", "tar"}`` (a base64 tar of the source)  ``{}``
get         ``{"id", "source"}``                                   ``{"tar"}`` (base64)
snapshot    ``{"id"}``                                             ``{"image"}``
stop        ``{"id"}`` (end every process; files stay)             ``{}``
changes     ``{"id", "drop", "max_bytes", "max_entries"}``         ``{"tar"`` (base64), ``"changed",
            (read by the provider, not in the container;           "deleted", "opaque", "dropped",
            413 past the bounds)                                   "size"}`` (``ChangeSet``)
cpu         ``{"id"}``                                             ``{"cpu_seconds"}`` (or null)
destroy     ``{"id"}`` (a gone one is no error)                    ``{}``
list        ``{"label"}``                                          ``{"items": [{"id", "kind"
                                                                   ("container"|"image"),
                                                                   "labels"}]}``
remove      ``{"ids"}``                                            ``{}``
rmi         ``{"image"}`` (a gone one is no error; one in use is)   ``{}``
==========  =====================================================  ================================

A ``Spec``'s ``mounts`` are copied in with ``put`` right after ``create`` (a remote provider
cannot see this host's files; read-only is then the provider's to enforce, if it can).

The provider enforces ``Limits`` on its side, ``disk_mb`` included: bounding what a container
writes is the provider's job (a quota, a sized volume); a container that went past it has its
processes killed and answers every exec after with ``disk_exceeded: true`` (an ``ExecResult``
field), which this client keeps as ``RemoteContainer.disk_exceeded``. The provider enforces an
exec's deadline and output bound on its side; this client holds it to
them too (its own deadline a few seconds later; an answer's text cut to ``max_output``). The
reaper's decision stays on this side: the provider lists what carries a lease, and
``lease.orphan_reason`` (is the owner on this host alive, is the deadline past) decides.

The answers and transport failures become ``ContainerError`` in one place: ``_call``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import tarfile
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from rollgym.containers import lease as leases
from rollgym.containers.runtime import (
    CHANGES_MAX_BYTES,
    CHANGES_MAX_ENTRIES,
    ChangeSet,
    ExecResult,
    Spec,
)
from rollgym.errors import ContainerError, RollgymError
from rollgym.http.default import default_transport
from rollgym.http.transport import JSON_HEADERS, Request

GRACE = 5.0
"""Seconds past a call's own timeout that this client waits for the provider's answer."""
CONTROL_TIMEOUT = 60.0
"""Seconds for calls without a timeout of their own (destroy, list, remove)."""


class RemoteRuntime:
    """Containers of a remote provider speaking the shape above at ``url``."""

    def __init__(self, url: str, *, name: str = "remote") -> None:
        self.url = url.rstrip("/")
        self.name = name
        self._transport = default_transport()

    async def close(self) -> None:
        await self._transport.close()

    async def _call(self, verb: str, body: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """One call; a transport failure or a non-2xx answer raises ``ContainerError`` (the
        transport's own typed error as its origin)."""
        request = Request(
            url=f"{self.url}/sandboxes/{verb}",
            body=orjson.dumps(body),
            headers=JSON_HEADERS,
            timeout=timeout,
            connect_timeout=min(timeout, 10.0),
            server=self.name,
            endpoint=f"/sandboxes/{verb}",
        )
        try:
            answer = await self._transport.send(request)
        except RollgymError as exc:
            raise ContainerError(
                f"{self.name} {verb} failed: {exc.message}",
                server=self.name,
                endpoint=verb,
                retryable=exc.retryable,
                origin=exc,
            ) from exc
        if not 200 <= answer.status < 300:
            raise ContainerError(
                f"{self.name} {verb} answered {answer.status}",
                status=answer.status,
                body=answer.body,
                server=self.name,
                endpoint=verb,
                retryable=answer.status in (502, 503, 504),
            )
        try:
            data = orjson.loads(answer.body)
        except orjson.JSONDecodeError as exc:
            raise ContainerError(
                f"{self.name} {verb} answered no JSON",
                body=answer.body,
                server=self.name,
                endpoint=verb,
            ) from exc
        if not isinstance(data, dict):
            raise ContainerError(
                f"{self.name} {verb} answered {type(data).__name__}, not an object",
                server=self.name,
                endpoint=verb,
            )
        return data

    async def create(self, spec: Spec, *, timeout: float) -> RemoteContainer:
        if spec.lease.deadline <= time.time():
            raise ContainerError(
                f"lease of run {spec.lease.run!r} is past its deadline: no container started",
                server=self.name,
                endpoint="create",
            )
        wire = {
            "image": spec.image,
            # Every limit, disk_mb too, is the provider's to enforce (the module's docstring).
            "limits": asdict(spec.limits),
            "lease": asdict(spec.lease),
            "workdir": spec.workdir,
            "env": spec.env,
            "labels": {**spec.labels, **leases.to_labels(spec.lease)},
        }
        data = await self._call("create", {"spec": wire}, timeout=timeout)
        made = RemoteContainer(self, str(data["id"]), spec)
        try:
            for mount in spec.mounts:
                await made.put(mount.source, mount.target, timeout=timeout)
        except BaseException:
            await made.destroy()
            raise
        return made

    async def remove_image(self, image: str, *, timeout: float) -> None:
        await self._call("rmi", {"image": image}, timeout=timeout + GRACE)

    async def reap(self, *, now: float | None = None) -> list[str]:
        data = await self._call("list", {"label": leases.MARK}, timeout=CONTROL_TIMEOUT)
        doomed: list[str] = []
        # Containers first: an image a container still uses may not go before it.
        items = sorted(data.get("items") or [], key=lambda item: item.get("kind") != "container")
        for item in items:
            lease = leases.from_labels(item.get("labels") or {})
            if lease is not None and leases.orphan_reason(lease, now=now):
                doomed.append(str(item["id"]))
        if doomed:
            await self._call("remove", {"ids": doomed}, timeout=CONTROL_TIMEOUT * 2)
        return doomed


class RemoteContainer:
    """One container of a ``RemoteRuntime``."""

    def __init__(self, runtime: RemoteRuntime, ident: str, spec: Spec) -> None:
        self.runtime = runtime
        self._id = ident
        self.spec = spec
        self._disk_exceeded = False

    @property
    def id(self) -> str:
        return self._id

    @property
    def disk_exceeded(self) -> bool:
        """Whether an exec's answer said the provider ended this container at its disk limit."""
        return self._disk_exceeded

    async def exec(
        self,
        command: list[str] | str,
        *,
        timeout: float,
        max_output: int = 65536,
        stdin: bytes | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        body = {
            "id": self._id,
            "command": command,
            "timeout": timeout,
            "max_output": max_output,
            "stdin": None if stdin is None else base64.b64encode(stdin).decode(),
            "workdir": workdir,
            "env": env or {},
        }
        try:
            data = await self.runtime._call("exec", body, timeout=timeout + GRACE)
        except ContainerError as exc:
            if exc.origin is not None and exc.origin.type == "read_timeout":
                # The provider kept no deadline: say so as this exec's outcome.
                return ExecResult(None, "", "", timeout + GRACE, timed_out=True)
            raise
        stdout, stderr = str(data.get("stdout", "")), str(data.get("stderr", ""))
        cut = len(stdout) > max_output or len(stderr) > max_output
        code = data.get("exit_code")
        self._disk_exceeded = self._disk_exceeded or data.get("disk_exceeded") is True
        return ExecResult(
            exit_code=code if isinstance(code, int) else None,
            stdout=stdout[:max_output],
            stderr=stderr[:max_output],
            seconds=float(data.get("seconds", 0.0)),
            timed_out=bool(data.get("timed_out", False)),
            truncated=bool(data.get("truncated", False)) or cut,
            disk_exceeded=data.get("disk_exceeded") is True,
        )

    async def put(self, source: Path, dest: str, *, timeout: float) -> None:
        tar = await asyncio.to_thread(_tar_of, source)
        await self.runtime._call("put", {"id": self._id, "dest": dest, "tar": tar}, timeout=timeout)

    async def get(self, source: str, dest: Path, *, timeout: float) -> None:
        data = await self.runtime._call("get", {"id": self._id, "source": source}, timeout=timeout)
        await asyncio.to_thread(_untar_to, str(data.get("tar", "")), dest)

    async def snapshot(self, *, timeout: float) -> str:
        data = await self.runtime._call("snapshot", {"id": self._id}, timeout=timeout)
        return str(data["image"])

    async def stop_processes(self, *, timeout: float) -> None:
        await self.runtime._call("stop", {"id": self._id}, timeout=timeout)

    async def changes(
        self,
        *,
        timeout: float,
        drop: tuple[str, ...] = (),
        max_bytes: int = CHANGES_MAX_BYTES,
        max_entries: int = CHANGES_MAX_ENTRIES,
    ) -> ChangeSet:
        body = {
            "id": self._id, "drop": list(drop), "max_bytes": max_bytes,
            "max_entries": max_entries,
        }  # fmt: skip
        data = await self.runtime._call("changes", body, timeout=timeout + GRACE)
        raw = base64.b64decode(str(data.get("tar", "")), validate=True)
        if len(raw) > max_bytes + (64 << 20):  # content plus its headers, generously
            raise ContainerError(
                f"{self.runtime.name} changes answered {len(raw)} bytes, past {max_bytes}",
                status=413, server=self.runtime.name, endpoint="changes",
            )  # fmt: skip
        archive = await asyncio.to_thread(_write_temp, raw)

        def paths(key: str) -> tuple[str, ...]:
            return tuple(str(p) for p in data.get(key) or [])

        return ChangeSet(
            archive=archive, changed=paths("changed"), deleted=paths("deleted"),
            opaque=paths("opaque"), dropped=paths("dropped"), size=int(data.get("size", 0)),
        )  # fmt: skip

    async def cpu_seconds(self) -> float | None:
        try:
            data = await self.runtime._call("cpu", {"id": self._id}, timeout=CONTROL_TIMEOUT)
        except ContainerError:
            return None
        value = data.get("cpu_seconds")
        return float(value) if isinstance(value, (int, float)) else None

    async def destroy(self) -> None:
        # Never raises: what a provider cannot remove now is left to the reaper.
        with contextlib.suppress(ContainerError):
            await self.runtime._call("destroy", {"id": self._id}, timeout=CONTROL_TIMEOUT)


def _tar_of(source: Path) -> str:
    """``source`` (a file or a directory) as a base64 tar with one top entry, its name."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(source, arcname=source.name)
    return base64.b64encode(buffer.getvalue()).decode()


def _write_temp(raw: bytes) -> Path:
    fd, name = tempfile.mkstemp(prefix="rollgym-changes-", suffix=".tar")
    with os.fdopen(fd, "wb") as out:
        out.write(raw)
    return Path(name)


def _untar_to(encoded: str, dest: Path) -> None:
    """Unpack a tar of one top entry (``get``'s answer) as ``dest``. The archive comes from a
    container the policy controlled: the ``data`` filter refuses links and paths that leave
    ``dest``'s directory, and device files."""
    raw = base64.b64decode(encoded, validate=True)
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
        members = tar.getmembers()
        tops = {m.name.split("/", 1)[0] for m in members}
        if len(tops) != 1:
            raise ContainerError(
                f"a copy out holds {len(tops)} top entries, not one", endpoint="get"
            )
        top = tops.pop()
        for member in members:
            member.name = dest.name + member.name[len(top) :]
        tar.extractall(dest.parent, members=members, filter="data")
