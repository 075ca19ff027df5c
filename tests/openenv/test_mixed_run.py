"""The mixed run of the README (examples/mixed/config.yaml): one config, one ``rollgym run``,
collecting from reasoning-gym, an OpenEnv environment (openenv-core's own server, launched by
rollgym), a bundled environment and NeMo Gym 0.4.0's own ``example_single_tool_call`` at once,
with per-environment metrics in metrics.json and in ``rollgym report``.

The NeMo Gym part needs the interop venv (``INTEROP_VENV``, made by ``interop/setup.sh``) and
~50 s to start and stop NeMo Gym; without it the same run goes without NeMo Gym's server and
rows. The model is rollgym's scripted stand-in (not a language model)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

pytest.importorskip("openenv.core", reason="needs openenv-core (the dev extra)")
pytest.importorskip("reasoning_gym", reason="needs reasoning-gym (the dev extra)")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mixed"
NEMO_SERVERS = ("nemo_tool_call", "nemo_agent")


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


@contextmanager
def nemo_gym(root: Path) -> Iterator[str]:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import nemo_gym as example  # examples/mixed/nemo_gym.py, as the README runs it

        from interop import nemo
    finally:
        sys.path.remove(str(EXAMPLE))
    # A free port can be taken by another process (Ray's workers start first) before NeMo
    # Gym's server binds it: a start that fails so is tried again on another port, twice.
    for attempt in range(3):
        server = example.nemo_gym_server(nemo.free_port(), root / f"nemo{attempt}")
        try:
            url = server.__enter__()
        except RuntimeError:
            if attempt == 2:
                raise
            continue
        try:
            yield url
        finally:
            server.__exit__(None, None, None)
        return


def prepare(root: Path, nemo_url: str | None) -> Path:
    """The example's folder copied under ``root``, its config pointed at NeMo Gym's server
    (or without it, and without its rows)."""
    folder = root / "mixed"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    config = yaml.safe_load((folder / "config.yaml").read_text())
    if nemo_url is None:
        for name in NEMO_SERVERS:
            del config["servers"][name]
        rows = [
            r
            for r in lines(folder / "tasks.jsonl")
            if r.get("agent_ref", {}).get("name") != "nemo_agent"
        ]
        (folder / "tasks.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    else:
        config["servers"]["nemo_tool_call"]["url"] = nemo_url
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


@pytest.mark.timeout(300)
@pytest.mark.parametrize("with_nemo", [False, True], ids=["without-nemo-gym", "with-nemo-gym"])
def test_the_mixed_run_collects_from_every_catalogue(tmp_path: Path, with_nemo: bool) -> None:
    if with_nemo and not os.environ.get("INTEROP_VENV"):
        pytest.skip("NeMo Gym's part needs INTEROP_VENV (interop/setup.sh; make interop04)")
    with nemo_gym(tmp_path) if with_nemo else nullcontext(None) as nemo_url:
        folder = prepare(tmp_path, nemo_url)
        out = tmp_path / "out"
        done = subprocess.run(
            [sys.executable, "-m", "rollgym", "run", str(folder / "config.yaml"), "--output", str(out)],
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    tasks = lines(folder / "tasks.jsonl")
    assert metrics["counts"] == {
        "total": 4 * len(tasks),
        "succeeded": 4 * len(tasks),
        "failed": 0,
        "pending": 0,
    }
    expected = {"lookup", "reasoning_gym", "reverse"} | ({"nemo_tool_call"} if with_nemo else set())
    by_env = metrics["by_environment"]
    assert set(by_env) == expected
    assert sum(e["succeeded"] for e in by_env.values()) == 4 * len(tasks)
    rollouts = lines(out / "rollouts.jsonl")
    # The OpenEnv environment's reward is its own: 1.0 exactly when the model reversed the word.
    reverse = [r for r in rollouts if "openenv_reset" in r]
    assert len(reverse) == 12 and by_env["reverse"]["tasks"] == 3
    for r in reverse:
        said = r["response"]["output"][0]["content"][0]["text"]
        assert r["reward"] == (1.0 if said == r["openenv_reset"]["word"][::-1] else 0.0), r
    mean = sum(r["reward"] for r in reverse) / len(reverse)
    assert by_env["reverse"]["reward"]["mean"] == pytest.approx(mean)
    assert 0 < mean < 1  # both alternatives were played
    # reasoning-gym's rows were scored by its own scorer (its reference answer scores 1.0).
    rg = [r for r in rollouts if "reasoning_gym" in r]
    assert (
        len(rg) == 16
        and {r["reward"] for r in rg} <= {0.0, 1.0}
        and max(r["reward"] for r in rg) == 1.0
    )
    if with_nemo:
        nemo_tasks = {
            t["task_index"]
            for t in lines(out / "tasks.jsonl")
            if t.get("agent_ref", {}).get("name") == "nemo_agent"
        }
        nemo_rows = [r for r in rollouts if r["task_index"] in nemo_tasks]
        assert len(nemo_rows) == 8 and by_env["nemo_tool_call"]["succeeded"] == 8
        # NeMo Gym's own verifier scored them (its example pays 1.0 for a weather tool call).
        assert by_env["nemo_tool_call"]["reward"]["mean"] == pytest.approx(
            sum(r["reward"] for r in nemo_rows) / 8
        )
    report = subprocess.run(
        [sys.executable, "-m", "rollgym", "report", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
    for name in expected:
        assert f"environment: {name} |" in report.stdout, report.stdout
    assert "Per environment" in (out / "report.html").read_text()
