"""NeMo Gym task rows run unchanged: foreign agent names, ``_ng_*`` indices, tools in the row,
and fields nobody reads reported instead of ignored."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect.rundir import prepare_run
from rollgym.collect.tasks import scan_tasks
from rollgym.config import parse_config
from rollgym.envs.echo.server import EchoEnv
from rollgym.errors import ConfigError, InputError
from rollgym.testing import serve_server
from tests.compat.nemo import Recorded, nemo_resources_app
from tests.compat.stack import (
    collect,
    echo_row,
    serve_stack,
    stack_config,
    write_rows,
)
from tests.compat.test_aggregate import post
from tests.support.ledger import read_jsonl

pytestmark = pytest.mark.timeout(60)

NEMO_REF = {"agent_ref": {"name": "mcqa_simple_agent"}}


def test_a_foreign_agent_name_is_refused_with_its_line_and_the_ways_out(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "tasks.jsonl", [echo_row(0), echo_row(1, **NEMO_REF)])
    cfg = stack_config()
    with pytest.raises(InputError) as err:
        prepare_run(cfg, cfg.collect, rows, tmp_path / "out", resume=False)
    message = err.value.message
    assert "tasks.jsonl:2: agent_ref.name 'mcqa_simple_agent'" in message
    assert "--agent agent" in message
    assert "collect.agent_aliases: {mcqa_simple_agent: agent}" in message


def test_an_alias_must_name_an_agent_server() -> None:
    with pytest.raises(ConfigError, match=r"agent_aliases\.x: 'env' is not an agent server"):
        stack_config({"agent_aliases": {"x": "env"}})


async def test_an_alias_maps_nemo_gyms_agent_name_to_an_agent_of_the_config(
    tmp_path: Path,
) -> None:
    rows = write_rows(tmp_path / "tasks.jsonl", [echo_row(i, **NEMO_REF) for i in range(3)])
    cfg = stack_config({"agent_aliases": {"mcqa_simple_agent": "agent"}})
    async with serve_stack() as urls:
        outcome = await collect(cfg, rows, tmp_path / "out", urls)
    assert outcome.exit_code == 0
    assert [r["reward"] for r in read_jsonl(tmp_path / "out" / "rollouts.jsonl")] == [1.0] * 3


async def test_the_agent_option_of_the_command_line_overrides_every_agent_ref(
    tmp_path: Path,
) -> None:
    from rollgym.cli.run import _collect_config

    rows = write_rows(tmp_path / "tasks.jsonl", [echo_row(0, **NEMO_REF), echo_row(1)])
    cfg = stack_config()
    collect_cfg = _collect_config(cfg, agent="agent")  # what `--agent agent` does
    assert collect_cfg.ignore_agent_ref
    async with serve_stack() as urls:
        from rollgym.collect import RunningServers, run_collection

        outcome = await run_collection(
            cfg, collect_cfg, rows, tmp_path / "out", RunningServers(urls), agent="agent",
            progress=False,
        )  # fmt: skip
    assert outcome.exit_code == 0
    assert len(read_jsonl(tmp_path / "out" / "rollouts.jsonl")) == 2


def _ng_row(index: int, ng_task: int, ng_rollout: int = 5) -> dict[str, Any]:
    return echo_row(index, _ng_task_index=ng_task, _ng_rollout_index=ng_rollout)


async def test_nemo_gyms_indices_are_read_and_every_output_row_carries_both_spellings(
    tmp_path: Path,
) -> None:
    # A chunk of a bigger file: NeMo Gym keeps a caller's task index (global across chunks)
    # and numbers the rollouts itself.
    rows = write_rows(tmp_path / "tasks.jsonl", [_ng_row(0, 700), _ng_row(1, 701)])
    out = tmp_path / "out"
    async with serve_stack() as urls:
        outcome = await collect(stack_config({"repeats": 2}), rows, out, urls)
    assert outcome.exit_code == 0
    expected = [(0, 0, 700, 0), (0, 1, 700, 1), (1, 0, 701, 0), (1, 1, 701, 1)]
    tasks = read_jsonl(out / "tasks.jsonl")
    four = ("task_index", "rollout_index", "_ng_task_index", "_ng_rollout_index")
    assert [tuple(t[k] for k in four) for t in tasks] == expected
    rollouts = sorted(read_jsonl(out / "rollouts.jsonl"), key=lambda r: r["_ng_rollout_index"])
    assert sorted(tuple(r[k] for k in four) for r in rollouts) == expected
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    assert metrics["pass_at_k"]["pass@2"] == 1.0  # grouped by task, as NeMo Gym groups them


def test_two_lines_of_one_nemo_gym_task_are_refused(tmp_path: Path) -> None:
    # NeMo Gym would run these as rollouts of one task; rollgym would make two tasks of them.
    rows = write_rows(tmp_path / "t.jsonl", [_ng_row(0, 3, 0), _ng_row(1, 4), _ng_row(2, 3, 1)])
    with pytest.raises(InputError, match=r"t\.jsonl:3: _ng_task_index 3 is also on an earlier"):
        scan_tasks(rows)
    bad = write_rows(tmp_path / "bad.jsonl", [echo_row(0, _ng_task_index="3")])
    with pytest.raises(InputError, match=r"bad\.jsonl:1: _ng_task_index must be an integer"):
        scan_tasks(bad)


async def test_a_row_without_tools_never_asks_a_nemo_gym_server_for_tools() -> None:
    seen = Recorded()
    row = {
        "responses_create_params": {
            "input": "Say v7.",
            "metadata": {"rollgym_script": [{"say": "v7"}]},
        },
        "expected_answer": "v7",
    }
    async with serve_stack(nemo_resources_app(seen)) as urls:
        status, verified = await post(f"{urls['agent'][0]}/run", row)
    assert status == 200, verified
    assert verified["reward"] == 1.0
    assert seen.paths() == ["/seed_session", "/verify"]
    assert verified["response"]["tools"] == []  # the model was offered none


async def test_tools_from_server_gives_rows_without_tools_the_environments_tools() -> None:
    row = echo_row(3, tools=False)
    async with serve_stack() as urls:
        status, without = await post(f"{urls['agent'][0]}/run", row)
    assert status == 200
    # Not offered, the tool the script calls is unknown: the answer misses.
    assert without["reward"] == 0.0
    async with serve_stack(tools_from_server=True) as urls:
        status, offered = await post(f"{urls['agent'][0]}/run", row)
    assert status == 200
    assert offered["reward"] == 1.0
    assert [t["name"] for t in offered["response"]["tools"]] == ["echo"]


class ReadsExpected(EchoEnv):
    row_fields = frozenset({"expected_answer"})


class Undeclared(EchoEnv):
    """An environment written before ``row_fields``: it says nothing of what it reads."""

    row_fields = None


async def test_health_reports_the_row_fields_a_server_reads() -> None:
    async with (
        serve_server(ReadsExpected, name="env") as (declared, _),
        serve_server(Undeclared, name="env") as (silent, _),
    ):
        _, health = await post(f"{declared}/health", {})
        _, unknown = await post(f"{silent}/health", {})
    assert health["row_fields"] == ["expected_answer"]
    assert unknown["row_fields"] is None


@pytest.mark.parametrize("env", [ReadsExpected, Undeclared])
async def test_a_row_field_nobody_reads_is_warned_about_once_per_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, env: type[EchoEnv]
) -> None:
    rows = write_rows(
        tmp_path / "tasks.jsonl",
        [echo_row(i, expected_answr="typo", _ng_task_index=i) for i in range(3)],
    )
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="rollgym.collect"):
        async with serve_stack(env) as urls:
            outcome = await collect(stack_config({"repeats": 2}), rows, out, urls)
    assert outcome.exit_code == 0
    warned = [r.getMessage() for r in caplog.records if "no server of the run" in r.getMessage()]
    assert len(warned) == 1
    (warning,) = orjson.loads((out / "run.json").read_bytes())["warnings"]
    assert warning == warned[0]
    listed = warning.split("says it reads: ")[1].split(" (")[0].split(", ")
    if env is ReadsExpected:
        assert listed == ["expected_answr"]  # declared fields and rollgym's own are not listed
    else:
        assert listed == ["expected_answer", "expected_answr"]
        assert "resources server(s) env do not declare" in warning


async def test_no_unread_field_warning_when_a_server_cannot_say_what_it_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # NeMo Gym's servers have no rollgym /health: they may read any field of the row, so a
    # warning that its fields are read by nobody would be false (it fired on every such run).
    row = {
        "responses_create_params": {
            "input": "Say v7.",
            "metadata": {"rollgym_script": [{"say": "v7"}]},
        },
        "expected_answer": "v7",
        "verifier_metadata": {"expected_city": "Paris"},
    }
    rows = write_rows(tmp_path / "tasks.jsonl", [row])
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="rollgym.collect"):
        async with serve_stack(nemo_resources_app(Recorded())) as urls:
            outcome = await collect(stack_config(), rows, out, urls)
    assert outcome.exit_code == 0
    assert not [r for r in caplog.records if "no server of the run" in r.getMessage()]
    # run.json may warn that the foreign server has no fingerprint (it says so, issue 41);
    # never that the row's fields go unread.
    warned = orjson.loads((out / "run.json").read_bytes()).get("warnings", [])
    assert not [w for w in warned if "no server of the run" in w or "read by" in w], warned


def test_a_config_without_impl_needs_a_url() -> None:
    cfg = parse_config(
        {"servers": {"agent": {"kind": "agent", "url": "http://127.0.0.1:9/"}}}, "c.yaml"
    )
    assert cfg.servers["agent"].impl is None
    from rollgym.server.base import check_servers

    check_servers(cfg)  # nothing to import for a server that runs elsewhere
    with pytest.raises(ConfigError, match=r"c\.yaml: invalid config\n  servers\.agent: impl"):
        parse_config({"servers": {"agent": {"kind": "agent"}}}, "c.yaml")
