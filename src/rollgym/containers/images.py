"""Images without a registry.

No registry is reachable from where rollgym runs its tests, but Debian's archive is. So:

- **A base image** is built once by ``mmdebstrap`` from Debian's archive and ``podman import``ed.
  Its tag is the digest of its recipe (suite, variant, packages, mirror), so a changed recipe is
  a new image and an unchanged one is never built twice: ``ensure_base()``. It holds python3,
  pytest, git, bash and coreutils, so most task images need no ``apt-get`` at all.
- **FROM names** that task Dockerfiles use are mapped to local builds (``FROM_MAP``); where the
  mapping is not exact (``python:3.12`` is Debian bookworm's Python 3.11) a warning says so.
- **Task images** are cached by the digest of the Dockerfile and its build context:
  ``build_task_image()`` rewrites ``FROM`` to the local image, runs ``podman build`` and tags
  ``localhost/rollgym-task:<digest>``. A Dockerfile that cannot be built here (an unknown
  ``FROM``, a ``RUN`` that fails, a build past its deadline) is an ``ImageBuildError`` naming
  the Dockerfile and its line, never a hang.

Two processes building the same digest take a lock file (``fcntl.flock``) in turn: the second
finds the image made by the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from rollgym.containers import lease as leases
from rollgym.containers.podman import die_with_parent
from rollgym.errors import ContainerError, ImageBuildError

log = logging.getLogger(__name__)

BASE_REPO = "localhost/rollgym-base"
TASK_REPO = "localhost/rollgym-task"
CACHE_LABEL = "rollgym.cache"
"""Label on images built here (``base`` or ``task``): a cache, never leased or reaped."""
BASE_TIMEOUT = 900.0
"""Seconds allowed to build the base image (mmdebstrap typically takes 20-60 s)."""


@dataclass(frozen=True, slots=True)
class BaseRecipe:
    """What the base image is made of; its digest is the image's tag."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = (
        "python3", "python3-pytest", "python3-venv", "python3-pip", "python-is-python3", "git",
        "bash", "coreutils", "procps", "ca-certificates", "patch", "diffutils", "findutils",
        "grep", "sed", "curl",
    )  # fmt: skip
    mirror: str = "http://deb.debian.org/debian"
    # LANG as Debian's own images; PIP_BREAK_SYSTEM_PACKAGES as the python images, whose pip
    # installs into the system (Debian's pip would refuse it: PEP 668).
    env: tuple[str, ...] = ("LANG=C.UTF-8", "PIP_BREAK_SYSTEM_PACKAGES=1")

    def digest(self) -> str:
        raw = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:16]

    @property
    def tag(self) -> str:
        return f"{BASE_REPO}:{self.digest()}"


BASE = BaseRecipe()


def lock_dir() -> Path:
    """Where build lock files live (shared by every process of this user on this host)."""
    path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollgym" / "locks"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def build_lock(key: str, *, timeout: float) -> Iterator[None]:
    """Hold the lock of ``key`` (one build of one digest at a time); wait at most ``timeout``
    seconds for another process's build, then fail typed."""
    path = lock_dir() / f"{key}.lock"
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ImageBuildError(
                        f"waited {timeout:.0f} s for another process's build of {key} "
                        f"(lock {path})",
                        server="podman",
                        endpoint="build",
                        retryable=True,
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _podman(*args: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            ["podman", "--runtime", "runc", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise ContainerError(
            f"podman {args[0]} took longer than {timeout:.0f} s",
            server="podman",
            endpoint=args[0],
            retryable=True,
        ) from exc
    if check and done.returncode != 0:
        raise ContainerError(
            f"podman {args[0]} failed (exit {done.returncode})",
            status=done.returncode,
            body=done.stderr[-4000:],
            server="podman",
            endpoint=args[0],
        )
    return done


def image_exists(ref: str) -> bool:
    """Whether ``ref`` is in local storage."""
    return _podman("image", "exists", ref, timeout=60, check=False).returncode == 0


def ensure_base(recipe: BaseRecipe = BASE, *, timeout: float = BASE_TIMEOUT) -> str:
    """The base image's tag, building it first if this host has none (once per recipe, under a
    lock). Needs root, ``mmdebstrap`` and Debian's archive."""
    tag = recipe.tag
    if image_exists(tag):
        return tag
    with build_lock(f"base-{recipe.digest()}", timeout=timeout):
        if image_exists(tag):  # built by another process while this one waited
            return tag
        if shutil.which("mmdebstrap") is None:
            raise ImageBuildError(
                "the base image needs mmdebstrap (scripts/install_containers.sh installs it)",
                server="podman",
                endpoint="build",
            )
        with tempfile.TemporaryDirectory(prefix="rollgym-base-") as tmp:
            tar = Path(tmp) / "rootfs.tar"
            started = time.monotonic()
            try:
                argv = [
                    "mmdebstrap", "--quiet", f"--variant={recipe.variant}",
                    f"--include={','.join(recipe.packages)}", recipe.suite, str(tar), recipe.mirror,
                ]  # fmt: skip
                done = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired as exc:
                raise ImageBuildError(
                    f"mmdebstrap of {recipe.suite} took longer than {timeout:.0f} s",
                    server="podman",
                    endpoint="build",
                    retryable=True,
                ) from exc
            if done.returncode != 0:
                raise ImageBuildError(
                    f"mmdebstrap of {recipe.suite} failed (exit {done.returncode}): is "
                    f"{recipe.mirror} reachable?",
                    status=done.returncode,
                    body=done.stderr[-4000:],
                    server="podman",
                    endpoint="build",
                )
            changes = [f"--change=ENV {pair}" for pair in recipe.env]
            _podman(
                "import",
                "--change", 'CMD ["/bin/bash"]',
                *changes,
                "--change", f"LABEL {CACHE_LABEL}=base",
                "--change", f"LABEL rollgym.recipe={recipe.digest()}",
                str(tar), tag,
                timeout=600,
            )  # fmt: skip
            log.info("built %s in %.0f s", tag, time.monotonic() - started)
    return tag


# -- FROM names ----------------------------------------------------------------------------------

BASE_PYTHON = "3.11"
"""Debian bookworm's Python, the one the base image holds."""


@dataclass(frozen=True, slots=True)
class FromMapping:
    """What a Dockerfile's ``FROM`` becomes here: a local image and, when the two differ in a
    way a task could notice, a sentence saying how."""

    image: str
    inexact: str | None = None


def map_from(ref: str, *, base: str) -> FromMapping | None:
    """The local build for a ``FROM`` reference, or None when there is none. The mapping:

    - ``debian``, ``debian:bookworm``, ``debian:12``, ``debian:stable``, ``debian:latest`` (each
      ``-slim`` too): the base image (Debian bookworm, plus python3, pytest, git, ...);
    - ``python``, ``python:3``, ``python:3.11`` (``-slim``, ``-bookworm``): the base image
      (Debian's Python 3.11, with ``python`` and ``pip`` as in the python images);
    - ``python:3.X`` for another X: the base image, with a warning (3.11, not 3.X);
    - ``ubuntu`` and ``ubuntu:*``, ``debian:<another release>``, ``buildpack-deps:*``: the base
      image, with a warning (Debian bookworm, not the named release);
    - an image already in local storage (``localhost/...``, a built task image): itself.

    Anything else (alpine, node, a registry's image) has no local build."""
    name, _, tag = ref.partition(":")
    name = name.removeprefix("docker.io/").removeprefix("library/")
    tag = tag or "latest"
    flavour = tag
    for suffix in ("-slim-bookworm", "-bookworm", "-slim"):
        flavour = flavour.removesuffix(suffix)
    if name == "debian":
        if flavour in ("bookworm", "12", "stable", "latest") or flavour.startswith("bookworm-"):
            return FromMapping(base)
        return FromMapping(base, f"{ref} is built as Debian bookworm (12), not {tag}")
    if name == "python":
        version = flavour.split("-")[0]
        if version in ("latest", "3", BASE_PYTHON) or version.startswith(BASE_PYTHON + "."):
            return FromMapping(base)
        return FromMapping(
            base, f"{ref} is built on Debian bookworm's Python {BASE_PYTHON}, not {version}"
        )
    if name in ("ubuntu", "buildpack-deps"):
        return FromMapping(base, f"{ref} is built as Debian bookworm, not {name}:{tag}")
    if ref.startswith("localhost/") and image_exists(ref):
        return FromMapping(ref)
    return None


# -- task images ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instruction:
    """One Dockerfile instruction: the line it starts on and its text (continuations joined)."""

    line: int
    text: str

    @property
    def keyword(self) -> str:
        return self.text.split(None, 1)[0].upper() if self.text else ""


def instructions(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, each with the line it starts on (comments and blank
    lines skipped, ``\\`` continuations joined)."""
    found: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction is dropped, as Docker does
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        found.append(Instruction(start, _squash(" ".join(pending))))
        pending = []
    if pending:
        found.append(Instruction(start, _squash(" ".join(pending))))
    return found


def _squash(text: str) -> str:
    return " ".join(text.split())


def rewrite_from(dockerfile: Path, *, base: str) -> tuple[str, list[str]]:
    """The Dockerfile's text with every ``FROM`` pointed at its local build, and the warnings
    of inexact mappings. An unmappable ``FROM`` is an ``ImageBuildError`` naming its line."""
    text = dockerfile.read_text()
    lines = text.splitlines()
    args: dict[str, str] = {}
    stages: set[str] = set()
    warnings: list[str] = []
    seen_from = False
    for ins in instructions(text):
        words = ins.text.split()
        if ins.keyword == "ARG" and not seen_from and len(words) > 1:
            key, _, value = words[1].partition("=")
            args[key] = value.strip("\"'")
            continue
        if ins.keyword != "FROM":
            continue
        seen_from = True
        rest = [w for w in words[1:] if not w.startswith("--")]  # --platform=...
        if not rest:
            raise _line_error(dockerfile, ins, "FROM names no image")
        ref = _substitute(rest[0], args)
        if len(rest) >= 3 and rest[1].upper() == "AS":
            stages.add(rest[2])
        if ref in stages or ref == "scratch":
            continue
        mapping = map_from(ref, base=base)
        if mapping is None:
            raise _line_error(
                dockerfile,
                ins,
                f"FROM {ref} has no local build (no registry is used; known: debian, "
                "python:3.x, ubuntu, localhost/ images)",
            )
        if mapping.inexact:
            warnings.append(f"{dockerfile}:{ins.line}: {mapping.inexact}")
        tail = " ".join(rest[1:])
        lines[ins.line - 1] = f"FROM {mapping.image} {tail}".rstrip()
    if not seen_from:
        raise ImageBuildError(f"{dockerfile}: no FROM line", server="podman", endpoint="build")
    return "\n".join(lines) + "\n", warnings


def _substitute(ref: str, args: dict[str, str]) -> str:
    for key, value in args.items():
        ref = ref.replace(f"${{{key}}}", value).replace(f"${key}", value)
    return ref


def _line_error(dockerfile: Path, ins: Instruction, why: str, **fields: object) -> ImageBuildError:
    return ImageBuildError(
        f"{dockerfile}:{ins.line}: {why} ({ins.text[:200]})",
        server="podman",
        endpoint="build",
        **fields,  # type: ignore[arg-type]
    )


def context_digest(dockerfile_text: str, context: Path, *, base: str) -> str:
    """The digest of a build: the (rewritten) Dockerfile, the base image it maps to, and every
    file of the context (path, mode, content; a link's target)."""
    hasher = hashlib.sha256()
    hasher.update(base.encode() + b"\0" + dockerfile_text.encode() + b"\0")
    for path in sorted(context.rglob("*")):
        rel = path.relative_to(context).as_posix()
        if path.is_symlink():
            hasher.update(f"L {rel} {os.readlink(path)}\0".encode())
        elif path.is_file():
            hasher.update(f"F {rel} {path.stat().st_mode & 0o777:o}\0".encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    hasher.update(chunk)
            hasher.update(b"\0")
        elif path.is_dir():
            hasher.update(f"D {rel}\0".encode())
    return hasher.hexdigest()[:16]


def build_task_image(
    dockerfile: Path,
    context: Path,
    *,
    timeout: float = 900.0,
    base: str | None = None,
) -> str:
    """The image of a task's Dockerfile: ``localhost/rollgym-task:<digest>``, built now unless
    this host has it (two processes building one digest take turns: the second finds it).
    ``FROM`` is rewritten to its local build (``map_from``; inexact mappings are logged as
    warnings). A build that fails or runs past ``timeout`` is an ``ImageBuildError`` naming the
    Dockerfile's line."""
    base = base or ensure_base()
    text, warnings = rewrite_from(dockerfile, base=base)
    for warning in warnings:
        log.warning("%s", warning)
    tag = f"{TASK_REPO}:{context_digest(text, context, base=base)}"
    if image_exists(tag):
        return tag
    with build_lock(tag.rsplit(":", 1)[1], timeout=timeout):
        if image_exists(tag):
            return tag
        # The build's FROM is a tag of its own naming this process: buildah names its working
        # container after it, so what a killed build leaves is found and reaped by its owner.
        # podman 4.3 rewrites an image's names from what it read: a build running beside this
        # one can drop the new tag (the build then fails 'image not known': tried again, at
        # most 3 times) or bring an untagged one back (the reaper takes it with its owner).
        for attempt in range(3):
            name = f"rollgym-build-{leases.owner_token()}-{secrets.token_hex(4)}"
            alias = f"localhost/{name}:from"
            _tag(base, alias, timeout=timeout)
            try:
                build_text, _ = rewrite_from(dockerfile, base=alias)
                with tempfile.TemporaryDirectory(prefix="rollgym-build-") as tmp:
                    rewritten = Path(tmp) / "Dockerfile"
                    rewritten.write_text(build_text)
                    log.info("building %s from %s", tag, dockerfile)
                    _build(rewritten, dockerfile, context, tag, timeout=timeout)
                break
            except ImageBuildError as exc:
                lost = f"{alias}: image not known" in f"{exc.message} {exc.body}"
                if not lost or attempt == 2:
                    raise
                log.warning("the build's FROM tag %s was lost to a concurrent build: again", alias)
            finally:
                _remove_build_leftovers(name, alias)
    return tag


def _remove_build_leftovers(name: str, alias: str) -> None:
    """Remove the working containers of the build named ``name`` (left when it was killed) and
    its ``FROM`` tag."""
    listed = _podman(
        "ps", "-a", "--external", "--format", "{{.ID}} {{.Names}}", timeout=60, check=False
    )
    ids = [
        line.split()[0]
        for line in listed.stdout.splitlines()
        if len(line.split()) > 1 and line.split()[1].startswith(name + "-working-container")
    ]
    if ids:
        _podman("rm", "-f", *ids, timeout=120, check=False)
    with build_lock("tags", timeout=120):
        _podman("rmi", alias, timeout=60, check=False)


def _tag(image: str, alias: str, *, timeout: float) -> None:
    """``podman tag`` under a host-wide lock: two tags of one image at once lose one of them
    (podman 4.3 rewrites the image's list of names; seen as 'image not known' right after)."""
    with build_lock("tags", timeout=timeout):
        _podman("tag", image, alias, timeout=60)
        if not image_exists(alias):
            raise ImageBuildError(
                f"podman tag {image} {alias} did not hold", server="podman", endpoint="build"
            )


STEP = re.compile(r"^STEP \d+/\d+: (.*)$", re.M)
FAILED_AT = re.compile(r'building at STEP "(.*?)": ', re.S)


def _build(rewritten: Path, dockerfile: Path, context: Path, tag: str, *, timeout: float) -> None:
    argv = [
        "podman", "--runtime", "runc", "build", "--pull=never", "--layers=false", "--force-rm",
        "--label", f"{CACHE_LABEL}=task", "-t", tag, "-f", str(rewritten), str(context),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, errors="replace", start_new_session=True, preexec_fn=die_with_parent,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # podman, and the RUN step's container under it: runc starts that in a session of its
        # own, so killing podman's group would leave the step running.
        _kill_tree(proc.pid)
        stdout, stderr = proc.communicate(timeout=60)
        steps = STEP.findall(stdout or "")
        ins = _instruction_of(dockerfile, steps[-1]) if steps else None
        where = f"{dockerfile}:{ins.line}" if ins else str(dockerfile)
        raise ImageBuildError(
            f"{where}: the build took longer than {timeout:.0f} s"
            + (f" ({ins.text[:200]})" if ins else ""),
            server="podman",
            endpoint="build",
            body=(stdout or "")[-4000:],
        ) from None
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    if done.returncode == 0:
        return
    failed = FAILED_AT.search(done.stderr)
    ins = _instruction_of(dockerfile, failed.group(1)) if failed else None
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no message"
    if ins is None:
        raise ImageBuildError(
            f"{dockerfile}: podman build failed (exit {done.returncode}): {last}",
            status=done.returncode,
            server="podman",
            endpoint="build",
            body=(done.stdout + done.stderr)[-4000:],
        )
    raise _line_error(
        dockerfile,
        ins,
        f"failed: {last}",
        status=done.returncode,
        body=(done.stdout + done.stderr)[-4000:],
    )


def _kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every process descending from it (whatever their session), found
    by their parent pids in ``/proc`` (twice: a process may fork while the first pass runs)."""
    for _ in range(2):
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        tree, todo = [], [root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children.get(pid, [])
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)


def _instruction_of(dockerfile: Path, step: str) -> Instruction | None:
    """The instruction of the original Dockerfile that podman printed as ``step`` (a rewritten
    ``FROM`` matches its line by position: every other line is unchanged)."""
    wanted = _squash(step)
    found = instructions(dockerfile.read_text())
    for ins in found:
        if _squash(ins.text) == wanted:
            return ins
    if wanted.upper().startswith("FROM"):
        return next((i for i in found if i.keyword == "FROM"), None)
    return None
