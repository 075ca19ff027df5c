"""Images without a registry: FROM names mapped to local builds (inexact ones said plainly), a
build cache keyed by the Dockerfile and its context, and every build that cannot succeed a
typed failure naming the Dockerfile's line, never a hang."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollgym.containers import images
from rollgym.containers import lease as leases
from rollgym.containers.images import (
    build_task_image,
    context_digest,
    instructions,
    map_from,
    rewrite_from,
)
from rollgym.errors import ImageBuildError

BASE = "localhost/rollgym-base:x"


@pytest.mark.parametrize(
    ("ref", "inexact"),
    [
        ("debian", None),
        ("debian:bookworm-slim", None),
        ("docker.io/library/debian:12", None),
        ("python:3.11-slim", None),
        ("python:3", None),
        ("python:3.12-slim-bookworm", "Python 3.11, not 3.12"),
        ("ubuntu:22.04", "not ubuntu:22.04"),
        ("debian:bullseye", "not bullseye"),
    ],
)
def test_from_names_map_to_the_base_and_say_when_inexact(ref: str, inexact: str | None) -> None:
    mapping = map_from(ref, base=BASE)
    assert mapping is not None and mapping.image == BASE
    if inexact is None:
        assert mapping.inexact is None
    else:
        assert mapping.inexact is not None and inexact in mapping.inexact


def test_unknown_from_names_have_no_local_build() -> None:
    assert map_from("alpine:3.19", base=BASE) is None
    assert map_from("ghcr.io/x/y:1", base=BASE) is None


def test_instructions_keep_their_first_line() -> None:
    text = "# c\nFROM debian\n\nRUN a \\\n  # inner\n  b\nCOPY x /x\n"
    found = [(i.line, i.text) for i in instructions(text)]
    assert found == [(2, "FROM debian"), (4, "RUN a b"), (7, "COPY x /x")]


def test_rewrite_maps_every_from_and_names_the_unknown_line(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG PY=3.12\nFROM python:${PY}-slim AS build\nRUN true\nFROM build\nRUN true\n"
    )
    text, warnings = rewrite_from(dockerfile, base=BASE)
    assert text.splitlines()[1] == f"FROM {BASE} AS build"
    assert text.splitlines()[3] == "FROM build"
    assert len(warnings) == 1 and warnings[0].startswith(f"{dockerfile}:2:")
    dockerfile.write_text("FROM debian\nRUN true\nFROM --platform=linux/amd64 alpine:3\n")
    with pytest.raises(ImageBuildError, match=r"Dockerfile:3: FROM alpine:3 has no local build"):
        rewrite_from(dockerfile, base=BASE)
    dockerfile.write_text("RUN true\n")
    with pytest.raises(ImageBuildError, match="no FROM"):
        rewrite_from(dockerfile, base=BASE)


def test_the_digest_follows_the_dockerfile_the_context_and_the_base(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("1")
    first = context_digest("FROM x\n", tmp_path, base=BASE)
    assert context_digest("FROM x\n", tmp_path, base=BASE) == first
    assert context_digest("FROM y\n", tmp_path, base=BASE) != first
    assert context_digest("FROM x\n", tmp_path, base=BASE + "2") != first
    (tmp_path / "a.txt").write_text("2")
    assert context_digest("FROM x\n", tmp_path, base=BASE) != first
    (tmp_path / "a.txt").chmod(0o755)
    assert context_digest("FROM x\n", tmp_path, base=BASE) not in (first,)


@pytest.fixture
def built_tags() -> Iterator[list[str]]:
    """Tags this test built, removed at its end (only those)."""
    tags: list[str] = []
    yield tags
    if tags:
        subprocess.run(["podman", "rmi", "-f", *tags], capture_output=True, timeout=120)


def _task(tmp_path: Path, dockerfile: str) -> Path:
    """A task context with a token of its own, so nothing is found in the cache by chance."""
    (tmp_path / "token").write_text(secrets.token_hex(8))
    (tmp_path / "Dockerfile").write_text(dockerfile)
    return tmp_path / "Dockerfile"


def test_a_task_image_is_built_once_and_runs(
    base_image: str, tmp_path: Path, built_tags: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    dockerfile = _task(
        tmp_path,
        "FROM python:3.12-slim\nCOPY token /token\nRUN python -c 'import pytest' && "
        "pip --version\nWORKDIR /app\n",
    )
    with caplog.at_level(logging.WARNING, logger=images.__name__):
        tag = build_task_image(dockerfile, tmp_path, timeout=300)
    built_tags.append(tag)
    assert tag.startswith(images.TASK_REPO + ":")
    assert any("Python 3.11, not 3.12" in r.getMessage() for r in caplog.records)
    assert build_task_image(dockerfile, tmp_path, timeout=300) == tag  # the cache
    out = subprocess.run(
        ["podman", "--runtime", "runc", "run", "--rm", "--network", "none",
         "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=512:512", tag, "cat", "/token"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.stdout == (tmp_path / "token").read_text()


def test_a_failing_run_names_its_line(base_image: str, tmp_path: Path) -> None:
    dockerfile = _task(
        tmp_path, "FROM debian:bookworm\n# a comment\nRUN true\nRUN echo one && \\\n  false\n"
    )
    with pytest.raises(ImageBuildError) as caught:
        build_task_image(dockerfile, tmp_path, timeout=300)
    assert f"{dockerfile}:4: failed" in caught.value.message
    assert "RUN echo one && false" in caught.value.message


def test_a_build_past_its_deadline_fails_typed_and_leaves_nothing_running(
    base_image: str, tmp_path: Path
) -> None:
    marker = f"sleep {3000 + secrets.randbelow(999)}"
    dockerfile = _task(tmp_path, f"FROM debian\nRUN true\nRUN {marker}\n")
    with pytest.raises(ImageBuildError, match="Dockerfile:3: the build took longer than 5 s"):
        build_task_image(dockerfile, tmp_path, timeout=5)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30)
    assert marker not in ps.stdout
    # Nor the build's working container, nor its FROM tag (both named by this process).
    mine = f"rollgym-build-{leases.owner_token()}-"
    listed = subprocess.run(
        ["podman", "ps", "-a", "--external", "--format", "{{.Names}}"],
        capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert mine not in listed
    tags = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}"], capture_output=True, text=True,
        timeout=60,
    ).stdout  # fmt: skip
    assert mine not in tags


CONCURRENT = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
from rollgym.containers.images import build_task_image
print("TAG", build_task_image(Path(sys.argv[1]), Path(sys.argv[2]), timeout=300))
"""


def test_two_processes_building_one_digest_take_turns(
    base_image: str, tmp_path: Path, built_tags: list[str]
) -> None:
    dockerfile = _task(tmp_path, "FROM debian\nCOPY token /token\nRUN sleep 1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(dockerfile), str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    tags = {line.split()[1] for out in outs for line in out.splitlines() if line.startswith("TAG")}
    built_tags.extend(tags)
    assert len(tags) == 1 and all(p.returncode == 0 for p in procs)
    assert sum(out.count("building ") for out in outs) == 1, outs


def test_builds_side_by_side_in_one_process_all_succeed(
    base_image: str, tmp_path: Path, built_tags: list[str]
) -> None:
    # Each build tags the base for its FROM; podman 4.3 can lose a tag to a build beside it
    # (seen as 'image not known'): such a build is tried again, not failed.
    from concurrent.futures import ThreadPoolExecutor

    dockerfiles = []
    for i in range(3):
        (tmp_path / str(i)).mkdir()
        dockerfiles.append(_task(tmp_path / str(i), "FROM debian\nCOPY token /token\n"))
    with ThreadPoolExecutor(3) as pool:
        tags = list(pool.map(lambda d: build_task_image(d, d.parent, timeout=300), dockerfiles))
    built_tags.extend(tags)
    assert len(set(tags)) == 3
