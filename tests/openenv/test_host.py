"""``impl: openenv``: an OpenEnv app (examples/mixed/reverse_env.py, on openenv-core's own
``create_app``) served as a server of a run, and ``rollgym check`` on a mixed config."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

pytest.importorskip("openenv.core", reason="needs openenv-core (the dev extra)")

from rollgym.check import check_env
from rollgym.config import load_config
from rollgym.errors import ConfigError
from rollgym.openenv.host import OpenEnvHost
from rollgym.server.fingerprint import Fingerprint
from rollgym.testing import serve_server

pytestmark = pytest.mark.timeout(120)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixed"


@pytest.fixture
def beside_example() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLE))
    yield
    sys.path.remove(str(EXAMPLE))


async def test_the_host_serves_the_app_behind_rollgyms_health(beside_example: None) -> None:
    async with (
        serve_server(OpenEnvHost, name="reverse", options={"app": "reverse_env:app"}) as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http,
    ):
        async with http.get(url + "/health") as resp:
            health = await resp.json()
        assert health["kind"] == "resources" and health["features"] == ["openenv"]
        async with http.get(url + "/schema") as resp:  # OpenEnv's own endpoint, unchanged
            assert (await resp.json())["action"]["required"] == ["message"]
        # The app raises (no word): FastAPI answers 500 and raises again; the connection
        # survives and the next request on it is answered.
        async with http.post(url + "/reset", json={}) as resp:
            assert resp.status == 500
        async with http.post(url + "/reset", json={"word": "abc"}) as resp:
            assert (await resp.json())["observation"]["word"] == "abc"


async def test_a_client_that_closes_first_leaves_no_traceback(
    beside_example: None, caplog: pytest.LogCaptureFixture
) -> None:
    # openenv-core's client sends "close" and closes at once; the app's own close comes second.
    from openenv.core import GenericEnvClient

    async with serve_server(OpenEnvHost, name="reverse", options={"app": "reverse_env:app"}) as (
        url,
        _,
    ):
        for _ in range(3):
            async with GenericEnvClient(base_url=url, message_timeout_s=15) as env:
                await env.reset(word="abc")
                assert (await env.step({"message": "cba"})).reward == 1.0
    # The server has stopped, so every handler has finished its close.
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


def test_a_bad_app_option_names_the_key() -> None:
    from rollgym.openenv.host import load_app

    with pytest.raises(ConfigError, match=r"servers\.x\.options\.app: importing no_such_module"):
        load_app("no_such_module:app", where="servers.x.options.app")
    with pytest.raises(ConfigError, match="has no 'nope'"):
        load_app("rollgym.wire:nope", where="servers.x.options.app")


async def test_rollgym_check_on_a_mixed_config_checks_each_environments_own_rows(
    tmp_path: Path,
) -> None:
    # The example without NeMo Gym's server, and without reasoning-gym's (whose scorer pool
    # takes seconds to start): lookup and the OpenEnv environment, each with its agent.
    data = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    for name in ("nemo_tool_call", "nemo_agent", "reasoning_gym", "rg_agent"):
        del data["servers"][name]
    data["collect"]["agent"] = "lookup_agent"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "reverse_env.py").write_bytes((EXAMPLE / "reverse_env.py").read_bytes())
    rows = [
        line
        for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines()
        if '"agent_ref"' in line and "nemo_agent" not in line
    ]
    (tmp_path / "tasks.jsonl").write_text("\n".join(rows) + "\n")
    cfg = load_config(config)
    report = await check_env(cfg, "lookup", log_dir=tmp_path / "logs")
    assert report.ok, report.findings
    assert "verifier discriminates" in [f.check for f in report.findings]


async def test_rollgym_check_says_an_openenv_server_is_not_its_to_check(
    beside_example: None,
) -> None:
    from rollgym.check import CheckReport, _check, _Env
    from rollgym.config import parse_config

    cfg = parse_config({"servers": {"reverse": {"kind": "resources", "impl": "openenv"}}})
    async with (
        serve_server(OpenEnvHost, name="reverse", options={"app": "reverse_env:app"}) as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http,
    ):
        report = CheckReport("reverse")
        await _check(_Env(http, url), "reverse", [], cfg, report)
    assert report.ok and [f.check for f in report.findings] == ["health", "openenv"]
    assert "not checked" in report.findings[1].detail


async def test_the_host_answers_the_apps_fingerprint(beside_example: None) -> None:
    """An OpenEnv app is no rollgym class: its fingerprint is the loaded modules of its own
    package (here a top-level module, the file alone), taken when the server starts."""
    from rollgym.server.provenance import file_sha256

    async with (
        serve_server(OpenEnvHost, name="reverse", options={"app": "reverse_env:app"}) as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http,
        http.get(url + "/fingerprint") as resp,
    ):
        said = await resp.json()
    assert resp.status == 200 and isinstance(said["id"], str)
    assert said["code"]["files"] == {"reverse_env.py": file_sha256(str(EXAMPLE / "reverse_env.py"))}


def test_a_packaged_apps_fingerprint_holds_the_modules_it_loaded(echo_env_root: Path) -> None:
    """OpenEnv's layout (``echo_env/server/app.py`` beside ``echo_env/models.py``): every module
    of its package counts, not only the app's own folder; a file edited after the start is
    told apart by the next fingerprint."""
    import importlib

    from rollgym.server.fingerprint import Fingerprint

    importlib.import_module("echo_env.server.app")
    before = Fingerprint.of_app("echo_env.server.app")
    assert {"echo_env/models.py", "echo_env/server/app.py"} <= set(before.code.files)
    assert Fingerprint.of_app("echo_env.server.app").id == before.id
    # The models module as imported (another test module's copy of the session fixture may
    # have made, and put first on sys.path, a root of its own: the full suite failed so).
    models = Path(importlib.import_module("echo_env.models").__file__ or "")
    text = models.read_text()
    try:
        models.write_text(text + "\n# edited\n")
        assert Fingerprint.of_app("echo_env.server.app").id != before.id
    finally:
        models.write_text(text)


_LAZY_APP = """
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route


async def step(request):
    from lazyenv.scoring import reward  # imported at the first step only

    return JSONResponse({"reward": reward((await request.json())["action"])})


app = Starlette(routes=[Route("/step", step, methods=["POST"])])
"""


@pytest.fixture
def lazy_app(tmp_path: Path) -> Iterator[Path]:
    """A package whose app imports its scoring module only at the first step, and a module
    beside the package that is not part of it."""
    package = tmp_path / "lazyenv"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "app.py").write_text(_LAZY_APP)
    (package / "scoring.py").write_text("def reward(action):\n    return float(action == 'ok')\n")
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n == "lazyenv" or n.startswith("lazyenv.")]:
        del sys.modules[name]


async def _served_fingerprint() -> tuple[dict[str, Any], float]:
    """The fingerprint a freshly started host answers for ``lazyenv.app:app``, and the reward
    of one step (which imports the scoring module, after the fingerprint was taken)."""
    options = {"app": "lazyenv.app:app"}
    async with (
        serve_server(OpenEnvHost, name="lazy", options=options) as (url, _),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http,
    ):
        async with http.get(url + "/fingerprint") as resp:
            said = await resp.json()
        async with http.post(url + "/step", json={"action": "ok"}) as resp:
            reward = (await resp.json())["reward"]
    for name in [n for n in sys.modules if n == "lazyenv" or n.startswith("lazyenv.")]:
        del sys.modules[name]  # the next start imports the files as they are then
    return said, reward


async def test_an_apps_fingerprint_holds_a_scoring_module_it_imports_lazily(
    lazy_app: Path,
) -> None:
    """A module the app imports only at its first step scores too: it is in the fingerprint
    taken at the start, and an edit to it gives another; an edit to a file outside the app's
    package does not."""
    first, reward = await _served_fingerprint()
    assert reward == 1.0
    assert "lazyenv/scoring.py" in first["code"]["files"]
    (lazy_app / "unrelated.py").write_text("X = 2\n")
    same, _ = await _served_fingerprint()
    assert same["id"] == first["id"]
    scoring = lazy_app / "lazyenv" / "scoring.py"
    scoring.write_text(scoring.read_text().replace("'ok'", "'ok' or True"))
    edited, reward = await _served_fingerprint()
    assert reward == 1.0 and edited["id"] != first["id"]
    assert (
        edited["code"]["files"]["lazyenv/scoring.py"]
        != first["code"]["files"]["lazyenv/scoring.py"]
    )


@pytest.mark.timeout(30)
def test_a_fifo_or_device_in_the_apps_package_is_named_never_read(lazy_app: Path) -> None:
    """A FIFO in the app's package (its ``open`` waits for a writer for ever) and a link to a
    device (whose read never ends) would hold the server's start up for good: each is named
    in the fingerprint as no regular file, never read; a loop of links is not followed."""
    package = lazy_app / "lazyenv"
    os.mkfifo(package / "pipe.py")
    os.mkfifo(package / "queue.txt")
    (package / "zeros.txt").symlink_to("/dev/zero")
    (package / "loop").symlink_to(package)
    __import__("lazyenv.app")  # loaded, as the host's app is

    said = Fingerprint.of_app("lazyenv.app").to_dict()
    assert said["code"]["files"]["lazyenv/pipe.py"] == "not a regular file"
    assert said["data"]["files"]["lazyenv/queue.txt"] == "not a regular file"
    assert said["data"]["files"]["lazyenv/zeros.txt"] == "not a regular file"
    assert "lazyenv/scoring.py" in said["code"]["files"]
    assert not any("loop" in name for name in said["code"]["files"])
