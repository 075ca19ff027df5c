"""Forging probes against the bundled tasks: none earns a reward, the probes that rewrite the
system trees are dropped (and say so), and the one that plants startup files where the verifier
still takes them is flagged. Each probe alone on the task with a git repository (where every
probe has something to find), and all of them together on every bundled task."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import rollgym.harbor.image as image
from rollgym.containers.lease import new_lease
from rollgym.containers.podman import PodmanRuntime
from rollgym.harbor.probes import PROBES, Probe, ProbeResult, run_probes
from tests.harbor.conftest import RUN, needs_podman

pytestmark = [needs_podman, pytest.mark.timeout(300)]

GIT_TASK = "fix-failing-test"


def _table(results: list[ProbeResult]) -> str:
    return "\n".join(
        f"{r.task} {r.probe}: reward {r.reward} suspect {r.suspect} dropped {r.dropped} "
        f"{r.error or ''}"
        for r in results
    )


def combined(probes: tuple[Probe, ...], name: str) -> Probe:
    """One agent that runs every probe in turn (each script in its own subshell)."""
    script = "\n".join(f"( {p.script} ) || true" for p in probes)
    expects = {p.expect for p in probes}
    return Probe(name, script, "flagged" if "flagged" in expects else "zero")


async def test_each_probe_alone_on_the_git_task(prepared: dict[str, Any]) -> None:
    results = await run_probes([prepared[GIT_TASK]], PodmanRuntime(), PROBES, run=RUN)
    assert all(r.sound for r in results), _table(results)
    assert all(r.error is None for r in results), _table(results)
    by_name = {r.probe: r for r in results}
    # Startup files in the user site reach the verifier's Python: flagged (docs/concepts/harbor.md).
    assert by_name["python_startup"].suspect
    # The tools the verifier and test.sh run are the image's: a rewrite of them earns nothing,
    # is no suspect (it had no effect), and is reported as dropped.
    for name in ("replace_tools", "path_shadow", "bin_swap"):
        assert by_name[name].reward == 0.0 and not by_name[name].suspect, _table(results)
        assert by_name[name].dropped > 0, _table(results)
    assert not by_name["reward_file"].suspect and not by_name["git_history"].suspect
    assert by_name["reward_file"].dropped == 0


async def test_every_probe_earns_nothing_on_every_bundled_task(prepared: dict[str, Any]) -> None:
    zero = combined(tuple(p for p in PROBES if p.expect == "zero"), "all_zero_probes")
    results = await run_probes(list(prepared.values()), PodmanRuntime(), (zero,), run=RUN)
    assert len(results) == len(prepared) >= 10
    assert [r for r in results if r.reward != 0.0] == [], _table(results)


async def test_the_git_probe_pays_where_history_was_left(
    prepared: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The control: without the preparation's cut of git history, the upstream fix on another
    # branch is one `git checkout` away, and the git probe takes the reward.
    monkeypatch.setattr(image, "SCRUB", "echo none")
    task = prepared[GIT_TASK].task
    raw = await image.prepare(task, PodmanRuntime(), new_lease(RUN, 600))
    git = next(p for p in PROBES if p.name == "git_history")
    (result,) = await run_probes([raw], PodmanRuntime(), (git,), run=RUN)
    assert result.reward == 1.0, _table([result])
    assert dataclasses.replace(result, reward=0.0).sound


async def test_the_trojan_probe_pays_where_the_tests_run_the_agents_code_as_root(
    prepared: dict[str, Any], tmp_path: Any
) -> None:
    # The control: fix-failing-test as it was, its hidden test importing calc.py into pytest's
    # own process (root): calc.py's os._exit(0) passed, and its process wrote reward.json.
    import shutil

    from rollgym.harbor.probes import named_code
    from rollgym.harbor.task import load_task
    from rollgym.harbor.trial import Prepared

    task_dir = tmp_path / GIT_TASK
    shutil.copytree(prepared[GIT_TASK].task.path, task_dir)
    (task_dir / "tests" / "test_hidden.py").write_text(
        "import sys\nsys.path.insert(0, '/app')\nfrom calc import mean\n\n\n"
        "def test_mean():\n    assert mean([1, 2, 3, 6]) == 3\n"
    )
    as_root = Prepared(load_task(task_dir), prepared[GIT_TASK].image)
    trojan = next(p for p in PROBES if p.name == "trojan_code")
    (result,) = await run_probes([as_root], PodmanRuntime(), (trojan,), run=RUN)
    assert result.reward == 1.0 and not result.sound, _table([result])
    assert named_code("Write `/app/greet.sh`, then /app/x/run.py; not ../y.sh") == [
        "/app/greet.sh",
        "/app/x/run.py",
    ]
