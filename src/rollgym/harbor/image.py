"""A task's image, prepared once for all its trials: built, and its git history cut to HEAD.

**Git history.** A task that ships a repository is fixed at a base commit: the image's ``HEAD``.
Whatever else its ``.git`` holds (other branches, tags, remotes, stashes, the reflog,
``ORIG_HEAD``, objects no ref reaches: an upstream fix among them) is an answer an agent can
read with ``git log --all``. So after the build, every repository in the image (every ``.git``
outside ``/proc``, ``/sys``, ``/dev``) keeps ``HEAD``'s branch only, loses its reflog and
alternates, and is pruned (``git gc --prune=now``). The result is snapshotted as the prepared
image; the agent's container starts from it. The layer below still holds the old objects on the
host's disk, but nothing inside a container can reach them.

A Dockerfile convention makes this cheap to check: build the repository in the image with the
base commit checked out (``HEAD``) and nothing after it needed.
"""

from __future__ import annotations

import asyncio

from rollgym.containers.runtime import Lease, Limits, Runtime, Spec
from rollgym.errors import ImageBuildError
from rollgym.harbor.task import HarborTask
from rollgym.harbor.trial import STEP_TIMEOUT, Prepared, scratch

SCRUB = r"""
set -eu
found=$(find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name .git -print)
[ -z "$found" ] && { echo none; exit 0; }
command -v git >/dev/null || { echo "a git repository is in the image but no git: $found" >&2; exit 3; }
for g in $found; do
  cd "$(dirname "$g")"
  G="git -c safe.directory=*"
  head=$($G symbolic-ref -q HEAD || true)
  $G for-each-ref --format='%(refname)' | while IFS= read -r r; do
    [ "$r" = "$head" ] || $G update-ref -d "$r"
  done
  gd=$($G rev-parse --git-dir)
  rm -rf "$gd/logs" "$gd/refs/original" "$gd/rebase-merge" "$gd/rebase-apply" \
    "$gd/ORIG_HEAD" "$gd/FETCH_HEAD" "$gd/MERGE_HEAD" "$gd/CHERRY_PICK_HEAD" \
    "$gd/objects/info/alternates" "$gd/shallow"
  $G reflog expire --expire=now --all
  $G gc --quiet --prune=now
  echo "scrubbed $(pwd)"
done
"""


async def prepare(task: HarborTask, runtime: Runtime, lease: Lease) -> Prepared:
    """The task's image built (cached by digest) and scrubbed of git history past HEAD; leased
    like the run's containers."""
    from rollgym.containers.images import build_task_image  # podman's, when a task needs it

    timeout = task.config.environment.build_timeout_sec
    built = await asyncio.to_thread(
        build_task_image, task.dockerfile, task.context, timeout=timeout
    )
    spec = Spec(image=built, limits=Limits(cpus=1.0, memory_mb=1024), lease=lease)
    async with scratch(runtime, spec) as box:
        scrub = await box.exec(["sh", "-c", SCRUB], timeout=STEP_TIMEOUT * 2)
        if scrub.exit_code != 0:
            raise ImageBuildError(
                f"{task.dockerfile}: removing git history past HEAD failed "
                f"(exit {scrub.exit_code}): {scrub.stderr[-400:]}",
                server="harbor",
                endpoint="prepare",
            )
        if scrub.stdout.strip() == "none":
            return Prepared(task, built)
        await box.stop_processes(timeout=STEP_TIMEOUT)
        image = await box.snapshot(timeout=STEP_TIMEOUT * 2)
    return Prepared(task, image)
