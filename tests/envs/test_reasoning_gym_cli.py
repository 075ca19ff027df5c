"""``rollgym tasks reasoning-gym`` and the bundled config, run as a user runs them: the command
in a subprocess, ``rollgym run`` with its real servers, ``rollgym check`` and ``report``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollgym.check import check_env
from rollgym.cli.main import main
from rollgym.config import load_config

pytestmark = pytest.mark.timeout(180)

ROLLGYM = str(Path(sys.executable).parent / "rollgym")
ENV_DIR = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs" / "reasoning_gym"
CONFIG = ENV_DIR / "config.yaml"
# The bundled example's rows, as config.yaml's comment says they were made.
EXAMPLE_ARGS = [
    "--dataset", "chain_sum", "--dataset", "leg_counting", "--dataset", "word_sorting",
    "--dataset", "arc_agi:0.5", "--size", "7", "--seed", "0", "--scripted",
]  # fmt: skip


def rollgym(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROLLGYM, *map(str, args)], capture_output=True, text=True, timeout=150,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip


def test_the_same_arguments_write_the_same_bytes(tmp_path: Path) -> None:
    args = ["--dataset", "chain_sum:2", "--dataset", "leg_counting:1", "--size", "30"]
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    assert rollgym("tasks", "reasoning-gym", *args, "--seed", "5", "-o", a).returncode == 0
    assert rollgym("tasks", "reasoning-gym", *args, "--seed", "5", "-o", b).returncode == 0
    done = rollgym("tasks", "reasoning-gym", *args, "--seed", "6", "--agent", "rg", "-o", c)
    assert done.returncode == 0
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    names = [r["reasoning_gym"]["dataset"] for r in rows]
    assert (names.count("chain_sum"), names.count("leg_counting")) == (20, 10)
    assert names != sorted(names)  # mixed, not in blocks
    first = rows[0]
    prompt = first["responses_create_params"]["input"]
    assert "<answer>" in prompt[0]["content"] and prompt[1]["content"] == first["question"]
    assert not list(tmp_path.glob("*.partial"))
    assert "agent_ref" not in first
    assert all(json.loads(line)["agent_ref"] == {"name": "rg"} for line in c.open())


def test_the_bundled_example_is_what_the_command_makes(tmp_path: Path) -> None:
    out = tmp_path / "example.jsonl"
    done = rollgym("tasks", "reasoning-gym", *EXAMPLE_ARGS, "--output", out)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (ENV_DIR / "data" / "example.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "chain_sun"], "did you mean chain_sum"),
        (["--dataset", "chain_sum", "--config", 'chain_sum={"min_term": 3}'],
         "no config key 'min_term'; did you mean 'min_terms'"),
        (["--dataset", "chain_sum", "--config", 'chain_sum={"min_terms": 9, "max_terms": 2}'],
         "chain_sum refuses config"),
        (["--dataset", "chain_sum", "--config", "chain_sum=[1]"], "expected a JSON object"),
        (["--dataset", "chain_sum", "--config", "leg_counting={}"], "not one of the --dataset"),
        (["--dataset", "chain_sum", "--config", 'chain_sum={"seed": 1}'], "set by --seed"),
        (["--dataset", "chain_sum:0"], "positive number"),
        (["--dataset", "chain_sum", "--dataset", "chain_sum:2"], "named twice"),
        (["--dataset", "game_of_life_halting"], "every non-empty answer scores 1.0"),
        (["--size", "3"], "name at least one dataset"),
    ],
)  # fmt: skip
def test_bad_arguments_are_one_clear_line(
    tmp_path: Path,
    args: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In this process, through the CLI's own entry point (a subprocess each costs seconds).
    out = tmp_path / "t.jsonl"
    monkeypatch.setattr(sys, "argv", ["rollgym", "tasks", "reasoning-gym", *args, "-o", str(out)])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert message in err, err
    assert "Traceback" not in err and not out.exists()


def test_list_names_every_offered_dataset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["rollgym", "tasks", "reasoning-gym", "--list"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    captured = capsys.readouterr()
    names = captured.out.splitlines()[1:]
    assert "chain_sum" in names and "arc_agi" in names and "composite" not in names
    # A refused dataset is not listed as offered; it is named apart, with its reason.
    assert "game_of_life_halting" not in names
    assert "not offered: game_of_life_halting: " in captured.err


async def test_rollgym_check_passes_on_the_bundled_config() -> None:
    report = await check_env(load_config(CONFIG))
    assert report.ok, [f for f in report.findings if not f.ok]


def test_rollgym_run_report_and_reverify_on_the_bundled_config(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = rollgym("run", CONFIG, "--output", out)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["counts"] == {"total": 28, "succeeded": 28, "failed": 0, "pending": 0}
    env = metrics["env_metrics"]
    for dataset in ("chain_sum", "leg_counting", "word_sorting", "arc_agi"):
        # each row's scripted alternatives are the reference and a wrong answer
        assert 0.0 < env[f"{dataset}/reward"] < 1.0
    assert env["answer_found"] == 1.0
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r["reward"] for r in rollouts} == {0.0, 1.0}
    done = rollgym("report", out)
    assert done.returncode == 0, done.stderr
    assert (out / "report.html").stat().st_size > 0
    again = tmp_path / "again"
    done = rollgym("reverify", out, "--config", CONFIG, "--output", again)
    assert done.returncode == 0, done.stderr[-2000:]
    diff = json.loads((again / "reverify_diff.json").read_text())
    assert json.loads((again / "metrics.json").read_text())["env_metrics"] == env, diff


def test_a_run_with_answers_the_scorer_cannot_read_scores_them_zero(tmp_path: Path) -> None:
    """prime_factorization's scorer raises on the scripted wrong answer (words, no factors):
    those rollouts are recorded and scored 0 (``scorer_raised``), not masked and not failed."""
    rows = tmp_path / "rows.jsonl"
    made = rollgym("tasks", "reasoning-gym", "--dataset", "prime_factorization", "--size", "3",
                   "--scripted", "--output", rows)  # fmt: skip
    assert made.returncode == 0, made.stderr
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.read_text().replace("data/example.jsonl", str(rows)))
    out = tmp_path / "out"
    done = rollgym("run", config, "--output", out)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["counts"]["failed"] == 0
    assert metrics["coverage"]["masked_rollouts"] == 0
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    raised = [r for r in records if r.get("reason") == "scorer_raised"]
    assert raised and all(r["reward"] == 0.0 for r in raised)
    assert {r["reward"] for r in records} == {0.0, 1.0}  # the references' 1.0 and the zeros
    assert 0.0 < metrics["env_metrics"]["prime_factorization/reward"] < 1.0
