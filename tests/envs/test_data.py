"""The bundled example data and configs: valid rows, valid scripts, reproducible, and scored by
the real verifiers exactly as the generator meant each scripted answer to be scored."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rollgym.config import load_config
from rollgym.envs.lookup.server import LookupEnv
from rollgym.envs.mcqa.server import option_letters
from rollgym.protocol import TaskRow
from rollgym.server.base import resolve_impl
from rollgym.server.resources import ResourcesServer
from rollgym.testing import serve_server

ENVS = ["lookup", "mcqa", "math"]
ENVS_DIR = Path(__file__).resolve().parents[2] / "src" / "rollgym" / "envs"
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "gen_env_data.py"

pytestmark = pytest.mark.timeout(60)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_env_data", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _rows(env: str) -> list[dict[str, Any]]:
    lines = (ENVS_DIR / env / "data" / "example.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def _script(row: dict[str, Any]) -> list[dict[str, Any]]:
    script = json.loads(row["responses_create_params"]["metadata"]["rollgym_script"])
    assert isinstance(script, list)
    return script


@pytest.mark.parametrize("env", ENVS)
def test_config_loads_and_names_the_env(env: str) -> None:
    path = ENVS_DIR / env / "config.yaml"
    cfg = load_config(path)
    klass = resolve_impl(cfg.servers[env].impl, "resources")
    assert issubclass(klass, ResourcesServer)
    assert klass.__module__ == f"rollgym.envs.{env}.server"
    assert cfg.servers["agent"].options == {"model": "model", "resources": env}
    assert cfg.servers["model"].impl == "scripted"
    assert cfg.collect.input is not None
    assert (cfg.base_dir() / cfg.collect.input).resolve() == (
        ENVS_DIR / env / "data" / "example.jsonl"
    )
    assert (cfg.collect.concurrency, cfg.collect.repeats) == (32, 4)


@pytest.mark.parametrize("env", ENVS)
def test_rows_are_valid_task_rows_with_valid_scripts(env: str) -> None:
    rows = _rows(env)
    assert 20 <= len(rows) <= 30
    for row in rows:
        TaskRow.model_validate(row)
        params = row["responses_create_params"]
        assert params["input"][0]["role"] == "user" and params["input"][0]["content"]
        assert "expected_answer" in row
        metadata = params["metadata"]
        # The OpenAI API takes string metadata values of at most 512 characters.
        assert all(isinstance(v, str) and len(v) <= 512 for v in metadata.values())
        script = _script(row)
        assert script, "empty script"
        for turn in script[:-1]:
            assert set(turn) in ({"call", "arguments"}, {"calls"}), turn
            calls = turn.get("calls") or [{"name": turn["call"], "arguments": turn["arguments"]}]
            for call in calls:
                spec = LookupEnv.tools[call["name"]]
                spec.arguments.model_validate(call["arguments"])
        final = script[-1]
        assert set(final) == {"say"} and isinstance(final["say"], list) and final["say"]
        assert all(isinstance(alt, str) and alt for alt in final["say"])


def test_lookup_rows_declare_the_env_tools() -> None:
    schema = [spec.schema() for spec in LookupEnv.tools.values()]
    for row in _rows("lookup"):
        assert row["responses_create_params"]["tools"] == schema


def test_mcqa_rows_expect_one_of_their_options() -> None:
    forms = set()
    for row in _rows("mcqa"):
        assert row["expected_answer"] in option_letters(row["options"])
        forms.add(type(row["options"]))
    assert forms == {dict, list}


def test_committed_data_is_what_the_generator_writes() -> None:
    gen = _generator()
    for env in ENVS:
        committed = (ENVS_DIR / env / "data" / "example.jsonl").read_text(encoding="utf-8")
        assert gen.render(gen.BUILDERS[env]()) == committed, f"{env}: run scripts/gen_env_data.py"


@pytest.mark.parametrize("env", ENVS)
def test_scripted_rewards_are_varied(env: str) -> None:
    tasks = _generator().BUILDERS[env]()
    means = [sum(t.rewarded) / len(t.rewarded) for t in tasks]
    assert 0.5 <= sum(means) / len(means) <= 0.8
    assert any(0 < m < 1 for m in means)  # some tasks pass on some repeats only


async def _score_alternative(
    env: Any, row: dict[str, Any], script: list[dict[str, Any]], text: str
) -> dict[str, Any]:
    """Play ``script`` up to its last turn as the agent would, then verify ``text``."""
    sid = await env.seed(row)
    tool_output = None
    for turn in script[:-1]:
        calls = turn.get("calls") or [{"name": turn["call"], "arguments": turn["arguments"]}]
        for call in calls:
            _, result = await env.call(call["name"], call["arguments"], sid)
            tool_output = json.dumps(result, separators=(",", ":"))
    if tool_output is not None:
        text = text.replace("{tool_output}", tool_output)
    status, verified = await env.verify(row, text, sid)
    assert status == 200, verified
    return dict(verified)


@pytest.mark.parametrize("env", ENVS)
async def test_verifiers_score_each_alternative_as_intended(
    connect: Callable[..., Any], env: str
) -> None:
    tasks = _generator().BUILDERS[env]()
    klass = resolve_impl(env, "resources")
    cases = [
        (task.row, _script(task.row), text, rewarded)
        for task in tasks
        for text, rewarded in zip(_script(task.row)[-1]["say"], task.rewarded, strict=True)
    ]
    async with serve_server(klass, name=env) as (url, _):
        client = connect(url)
        results = await asyncio.gather(
            *(_score_alternative(client, row, script, text) for row, script, text, _ in cases)
        )
    for (row, _, text, rewarded), verified in zip(cases, results, strict=True):
        assert verified["reward"] == float(rewarded), (row["expected_answer"], text)
