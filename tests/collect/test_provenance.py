"""Issue 41, item 3: every run records which environment scored it (a fingerprint per resources
server in ``run.json``, its short id on every record), and ``report --compare`` says when two
runs of one environment were scored by different code, data or version.

The environment here is a user's module beside its config (``weather.py``), served for real on
127.0.0.1; between the two runs its verifier is edited, or replaced by a file of the same name
and size with its modification time put back: the fingerprint reads the bytes, so both are
caught.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollgym.collect import Collector
from rollgym.collect.provenance import ask_fingerprints, compare_fingerprints
from rollgym.collect.rundir import prepare_run
from rollgym.config import RetryPolicy
from rollgym.errors import ConfigError
from rollgym.http import HttpClient, Target
from rollgym.server.fingerprint import Fingerprint, differences
from rollgym.server.resources import ResourcesServer
from rollgym.wire import FINGERPRINT_ENDPOINT, FINGERPRINT_FIELD
from tests.support.servers import CountingEcho
from tests.support.stack import running_stack, stack_config, write_tasks

pytestmark = pytest.mark.timeout(120)

WEATHER = """\
from tests.support.servers import CountingEcho


class Weather(CountingEcho):
    async def verify(self, session, task, response):
        return await super().verify(session, task, response)  # v1
"""
EDITED = WEATHER.replace("  # v1", "  # v2 (edited)")
# Same name, same size, other bytes: what a silent replacement looks like.
SWAPPED = WEATHER.replace("# v1", "# v9")


@pytest.fixture
def weather(tmp_path: Path) -> Any:
    """``weather.py`` in a folder of its own on sys.path, imported; removed after the test."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "weather.py").write_text(WEATHER)
    sys.path.insert(0, str(folder))
    sys.modules.pop("weather", None)
    try:
        yield importlib.import_module("weather")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("weather", None)


async def one_run(tmp_path: Path, env: type, name: str) -> Path:
    """Four rollouts through the stack with ``env`` as its environment, into ``name``/."""
    out = tmp_path / name
    async with running_stack(env=env) as stack:
        cfg = stack_config({"concurrency": 2})
        tasks = write_tasks(tmp_path / "tasks.jsonl", 4)
        run = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
        async with asyncio.timeout(60):
            outcome = await Collector(run, stack.urls, progress=False).execute()
    assert outcome.exit_code == 0
    return out


def replace(path: Path, text: str, *, keep_date: bool = False) -> None:
    """Write ``text`` over ``path``; ``keep_date``: with its size, its date put back."""
    before = path.stat()
    path.write_text(text)
    if keep_date:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_size == before.st_size


def read(path: Path) -> str:
    return path.read_text()


def recorded_ids(out: Path) -> set[str]:
    lines = (out / "rollouts.jsonl").read_bytes().splitlines()
    return {orjson.loads(line)[FINGERPRINT_FIELD] for line in lines}


def run_json(out: Path) -> dict[str, Any]:
    info: dict[str, Any] = orjson.loads((out / "run.json").read_bytes())
    return info


async def test_an_edited_verifier_is_told_apart_and_named(tmp_path: Path, weather: Any) -> None:
    first = await one_run(tmp_path, weather.Weather, "first")
    same = await one_run(tmp_path, weather.Weather, "same")
    replace(Path(weather.__file__), EDITED)
    second = await one_run(tmp_path, weather.Weather, "second")

    prints = [run_json(out)["fingerprints"]["env"] for out in (first, same, second)]
    # Every record names its environment's fingerprint, once per run in run.json.
    for out, print_ in zip((first, same, second), prints, strict=True):
        assert recorded_ids(out) == {print_["id"]}
        assert "weather.py" in print_["code"]["files"]
    assert prints[0]["id"] == prints[1]["id"]
    assert prints[0]["id"] != prints[2]["id"]

    assert compare_fingerprints(first, same) == []
    [said] = compare_fingerprints(first, second)
    assert said.startswith("environment env: scored by different environments")
    assert "code: weather.py changed" in said
    assert "data" not in said and "version" not in said

    # rollgym report --compare says it too (the terminal summary and the page).
    from rollgym.report import write_report

    made = write_report(first, [second])
    assert "code: weather.py changed" in made.summary
    assert "code: weather.py changed" in read(made.path)
    assert "scored by the same environments" in write_report(first, [same]).summary


async def test_a_same_name_file_replaced_silently_is_caught(tmp_path: Path, weather: Any) -> None:
    first = await one_run(tmp_path, weather.Weather, "first")
    replace(Path(weather.__file__), SWAPPED, keep_date=True)
    second = await one_run(tmp_path, weather.Weather, "second")
    [said] = compare_fingerprints(first, second)
    assert "code: weather.py changed" in said


def test_data_and_version_are_named_apart(tmp_path: Path, weather: Any) -> None:
    data = tmp_path / "answers.jsonl"
    data.write_text('{"a": 1}\n')
    one = Fingerprint.of(weather.Weather, [("answers.jsonl", data)], "1.0").to_dict()
    data.write_text('{"a": 2}\n')
    two = Fingerprint.of(weather.Weather, [("answers.jsonl", data)], "1.0").to_dict()
    three = Fingerprint.of(weather.Weather, [("answers.jsonl", data)], "1.1").to_dict()
    assert len({one["id"], two["id"], three["id"]}) == 3
    assert differences(one, two) == ["data: answers.jsonl changed"]
    assert differences(two, three) == ["version: '1.0' -> '1.1'"]


def test_the_bundled_environments_fingerprint_their_own_package() -> None:
    from rollgym.server.base import resolve_impl

    math = Fingerprint.of(resolve_impl("math")).to_dict()
    assert "rollgym/envs/math/server.py" in math["code"]["files"]
    assert "rollgym/envs/math/data/example.jsonl" in math["data"]["files"]
    # Not all of Python, nor rollgym's own server bases.
    assert all(name.startswith("rollgym/envs/math/") for name in math["code"]["files"])
    assert len(math["id"]) == 12


def test_a_tool_cannot_take_the_fingerprint_endpoint() -> None:
    from rollgym.server.resources import tool

    with pytest.raises(TypeError, match="reserved"):

        class Forger(ResourcesServer):
            @tool
            async def fingerprint(self, session: Any) -> dict[str, Any]:
                return {"id": "forged"}


async def test_a_server_without_a_fingerprint_is_recorded_as_unknown() -> None:
    """A foreign server (here: a model server standing in for the env's url:) answers no
    /fingerprint: recorded as unknown, with why, and the run goes on."""
    async with running_stack() as stack:
        cfg = stack_config()
        async with HttpClient() as client:
            found, warnings = await ask_fingerprints(
                client, cfg, {"env": stack.urls["model"], "model": stack.urls["model"]}
            )
    assert set(found) == {"env"}  # only resources servers are asked
    assert found["env"]["id"] is None
    assert found["env"]["unknown"].startswith("no /fingerprint (")
    [warning] = warnings
    assert warning.startswith("server env: no /fingerprint (")
    assert "which environment scored its rollouts is not recorded" in warning


async def test_the_fingerprint_is_taken_once_when_the_server_starts(
    tmp_path: Path, weather: Any
) -> None:
    """What the server loaded is what it reports: an edit after it started changes nothing
    it answers (the next server started reports the edit)."""
    from rollgym.testing import serve_server

    async with serve_server(weather.Weather, name="env") as (url, server), HttpClient() as client:
        target = Target.single("env", url, RetryPolicy(max_attempts=1))
        before = await client.call(target, FINGERPRINT_ENDPOINT, {}, deadline=5)
        replace(Path(weather.__file__), EDITED)
        after = await client.call(target, FINGERPRINT_ENDPOINT, {}, deadline=5)
    assert before == after == server.fingerprint.to_dict()  # type: ignore[attr-defined]
    assert Fingerprint.of(weather.Weather).id != before["id"]


async def test_a_foreign_url_server_is_unknown_and_run_json_says_why() -> None:
    """A server given by url: (an OpenEnv server elsewhere, another framework's) serves no
    /fingerprint: recorded as unknown, the reason naming it as one rollgym did not start."""
    from rollgym.config import parse_config

    async with running_stack() as stack:
        foreign = stack.urls["model"][0]  # answers 404 on /fingerprint, as a foreign server
        cfg = parse_config({"servers": {"env": {"kind": "resources", "url": foreign}}}, "cfg")
        async with HttpClient() as client:
            found, _ = await ask_fingerprints(client, cfg, {"env": [foreign]})
    assert found["env"]["id"] is None
    assert found["env"]["unknown"].startswith("no /fingerprint (")
    assert "given by url: and was not started by rollgym" in found["env"]["unknown"]


class _Retrained(CountingEcho):
    """Another version of the env: what a replica left running from an older checkout is."""

    version = "2"


async def test_replicas_scored_by_different_environments_stop_the_run_before_it_starts(
    tmp_path: Path,
) -> None:
    """Two replicas of one env answer different fingerprints: no record could name the one
    that scored it, so the run is refused at its start, naming both replicas and what differs,
    and nothing is dispatched."""
    async with running_stack(env_replica=_Retrained) as stack:
        cfg = stack_config()
        tasks = write_tasks(tmp_path / "tasks.jsonl", 4)
        run = prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
        with pytest.raises(ConfigError) as raised:
            async with asyncio.timeout(60):
                await Collector(run, stack.urls, progress=False).execute()
        assert stack.env.calls["seed_session"] == 0  # nothing was dispatched
    said = str(raised.value)
    one, two = stack.urls["env"]
    assert "server env: its replicas are scored by different environments" in said
    assert f"env replica 0 ({one})" in said and f"env replica 1 ({two})" in said
    ids = {Fingerprint.of(CountingEcho).id, Fingerprint.of(_Retrained, version="2").id}
    assert all(i in said for i in ids)
    assert "version: None -> '2'" in said or "version: '2' -> None" in said
    assert (
        not (tmp_path / "out" / "rollouts.jsonl").exists()
        or not (tmp_path / "out" / "rollouts.jsonl").read_bytes()
    )


async def test_replicas_that_agree_are_recorded_once_and_an_unknown_one_is_named() -> None:
    async with running_stack(env_replica=CountingEcho) as stack, HttpClient() as client:
        cfg = stack_config()
        found, warnings = await ask_fingerprints(client, cfg, {"env": stack.urls["env"]})
        assert found["env"] == stack.env.fingerprint.to_dict() and warnings == []
        foreign = stack.urls["model"][0]  # answers no /fingerprint
        urls = {"env": [*stack.urls["env"], foreign]}
        found, warnings = await ask_fingerprints(client, cfg, urls)
    assert found["env"] == stack.env.fingerprint.to_dict()
    [warning] = warnings
    assert warning.startswith(f"server env: env replica 2 ({foreign}): no /fingerprint (")
    assert "cannot be told" in warning


@pytest.mark.parametrize(
    "answer",
    [
        {"replicas": {}},  # "my replicas differ", naming none
        {"id": None, "replicas": {}},
        {"id": "x" * 100_000},  # stamped on every line of the run
        {"id": ""},
    ],
)
async def test_a_foreign_fingerprint_answer_that_names_no_usable_id_is_unknown(
    answer: dict[str, Any],
) -> None:
    """A foreign server's ``/fingerprint`` (a route of its own of that name) answering an
    empty mix of replicas, or an id no record should carry (empty, or 100,000 characters on
    every line), is recorded as unknown, with why: the run neither crashes at its start nor
    stamps its lines with it."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from rollgym.config import parse_config
    from rollgym.testing import serve_asgi

    async def said(request: Any) -> JSONResponse:
        return JSONResponse(answer)

    app = Starlette(routes=[Route(FINGERPRINT_ENDPOINT, said, methods=["GET", "POST"])])
    async with serve_asgi(app) as url, HttpClient() as client:
        cfg = parse_config({"servers": {"env": {"kind": "resources", "url": url}}}, "cfg")
        found, warnings = await ask_fingerprints(client, cfg, {"env": [url, url]})
    assert found["env"]["id"] is None, found
    assert found["env"]["unknown"].startswith("its /fingerprint answer names no id")
    assert len(orjson.dumps(found)) < 2000
    assert any("which environment scored its rollouts is not recorded" in w for w in warnings)
