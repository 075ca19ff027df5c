"""What a rollout's container can do, whoever runs it.

The seam is two Protocols: a ``Runtime`` makes containers, a ``Container`` runs commands in one,
copies files in and out, snapshots itself into an image, says what changed in its filesystem
(``changes``, read by the provider, never by a program in the container) and goes away. podman is the local
provider (``containers/podman.py``); E2B, Modal, Daytona or a Kubernetes sandbox would each be
one module implementing the same two Protocols. Every call has a deadline and every output a
bound: a container is run by code the policy wrote, so nothing it prints or does may hang or
flood the collector.

Every container carries a ``Lease`` (its run, the pid of the process that owns it, a deadline)
as labels, so a reaper started later, by any process, can tell what is orphaned
(``containers/lease.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Limits:
    """What one container may use. ``network`` is off unless a task allows it."""

    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    disk_mb: int | None = None
    network: bool = False
    nofile: int = 1024


@dataclass(frozen=True, slots=True)
class Lease:
    """Who a container belongs to, written on it as labels: a reaper removes it when ``owner_pid``
    is gone (on this host) or ``deadline`` (Unix time) has passed. ``owner_start`` is the
    owner's start time (``containers.lease.process_start``), so a reused pid is no owner; it is
    read when the labels are written if left empty. ``containers.lease.new_lease`` fills all."""

    run: str
    owner_pid: int
    deadline: float
    host: str = ""
    owner_start: str = ""


@dataclass(frozen=True, slots=True)
class ExecResult:
    """One command's outcome. ``exit_code`` is None when it was killed at its deadline
    (``timed_out``) or because the container went past its disk limit (``disk_exceeded``: the
    command, and every other in the container, was killed, or never started); ``truncated``
    says output past the bound was dropped."""

    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    truncated: bool = False
    disk_exceeded: bool = False


@dataclass(frozen=True, slots=True)
class Mount:
    """A host file or directory seen read-only in the container at ``target``. podman binds it;
    a remote provider copies it in at create (it cannot see this host's files)."""

    source: Path
    target: str


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """What a container's programs changed in its filesystem, over its image, read from outside.

    ``archive`` is a tar on this host of the kept additions and changes (paths relative to
    ``/``; links as links, never their targets); ``changed`` names them (absolute paths).
    ``deleted`` are the image's paths the container removed; ``opaque`` its directories whose
    image content is all gone (what is in ``archive`` below them is all there is). ``dropped``
    are the changes under the ``drop`` prefixes asked for: listed, not archived (``+`` added or
    changed, ``-`` deleted, ``!`` an opaque directory; a directory that only holds a change is
    not listed)."""

    archive: Path
    changed: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    opaque: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    size: int = 0

    def discard(self) -> None:
        """Remove the archive from this host (the change set is of no further use)."""
        self.archive.unlink(missing_ok=True)


CHANGES_MAX_BYTES = 2 << 30
"""The bytes of file content a ``ChangeSet``'s archive may hold by default."""
CHANGES_MAX_ENTRIES = 100_000
"""The paths a ``ChangeSet`` may list by default (kept, deleted and dropped together). A review's
480,000 empty files took 53 s to read and 129 s to unpack in the verifier (past its run's
deadline: an error on every retry); 100,000 is a large repository with its virtualenv."""
TOO_LARGE = 413
"""``ContainerError.status`` of a ``changes`` call past its bounds (the container's programs
wrote more than a verifier takes in)."""


@dataclass(frozen=True, slots=True)
class Spec:
    """How to start a container: its image, limits, lease and the rest of its setting."""

    image: str
    limits: Limits
    lease: Lease
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()


@runtime_checkable
class Container(Protocol):
    """One running container."""

    @property
    def id(self) -> str: ...

    @property
    def disk_exceeded(self) -> bool:
        """Whether the container went past ``Limits.disk_mb``: its processes were killed, and
        what it left must earn nothing (the trial scores it 0 and flags it)."""
        ...

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
        """Run ``command`` (a string runs under ``sh -c``); kill it at ``timeout`` seconds."""
        ...

    async def put(self, source: Path, dest: str, *, timeout: float) -> None:
        """Copy a host file or directory into the container at ``dest``."""
        ...

    async def get(self, source: str, dest: Path, *, timeout: float) -> None:
        """Copy ``source`` out of the container to the host path ``dest``."""
        ...

    async def snapshot(self, *, timeout: float) -> str:
        """An image of this container's filesystem as it is now (its changes over its image);
        the verifier's fresh container starts from it."""
        ...

    async def stop_processes(self, *, timeout: float) -> None:
        """End every process in the container (the agent phase is over)."""
        ...

    async def changes(
        self,
        *,
        timeout: float,
        drop: tuple[str, ...] = (),
        max_bytes: int = CHANGES_MAX_BYTES,
        max_entries: int = CHANGES_MAX_ENTRIES,
    ) -> ChangeSet:
        """The container's filesystem changes over its image, read by the provider (no program
        in the container takes part); call it after ``stop_processes``. Paths equal to or under
        a ``drop`` prefix are listed in ``dropped``, not archived. Past ``max_bytes`` or
        ``max_entries``: ``ContainerError`` with status ``TOO_LARGE``."""
        ...

    async def cpu_seconds(self) -> float | None:
        """CPU seconds the container's processes used so far (None: the provider cannot
        tell). Read it before ``destroy``."""
        ...

    async def destroy(self) -> None:
        """Remove the container; never raises for one already gone."""
        ...


@runtime_checkable
class Runtime(Protocol):
    """A provider of containers."""

    name: str

    async def create(self, spec: Spec, *, timeout: float) -> Container: ...

    async def remove_image(self, image: str, *, timeout: float) -> None:
        """Remove ``image`` (a ``Container.snapshot``'s, no longer needed); never raises for one
        already gone. An image a container still uses is not removed (``ContainerError``)."""
        ...

    async def reap(self, *, now: float | None = None) -> list[str]:
        """Remove every container and image of this provider whose lease has no live owner or
        is past its deadline; return their ids."""
        ...
