"""``impl: openenv``: an OpenEnv app (examples/mixed/reverse_env.py, on openenv-core's own
``create_app``) served as a server of a run, and ``rollgym check`` on a mixed config."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("openenv.core", reason="needs openenv-core (the dev extra)")

from rollgym.check import check_env
from rollgym.config import load_config
from rollgym.errors import ConfigError
from rollgym.openenv.host import OpenEnvHost
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


def test_a_bad_app_option_names_the_key() -> None:
    from rollgym.openenv.host import load_app

    with pytest.raises(ConfigError, match=r"servers\.x\.options\.app: importing no_such_module"):
        load_app("no_such_module:app", where="servers.x.options.app")
    with pytest.raises(ConfigError, match="has no 'nope'"):
        load_app("rollgym.wire:nope", where="servers.x.options.app")


async def test_rollgym_check_on_a_mixed_config_checks_each_environments_own_rows(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    text = (EXAMPLE / "config.yaml").read_text()
    kept = [line for line in text.splitlines() if "nemo_" not in line]
    config.write_text("\n".join(kept) + "\n")
    for name in ("reverse_env.py", "tasks.jsonl"):
        (tmp_path / name).write_bytes((EXAMPLE / name).read_bytes())
    cfg = load_config(config)
    report = await check_env(cfg, "lookup", log_dir=tmp_path / "logs")
    assert report.ok, report.findings
    assert "verifier discriminates" in [f.check for f in report.findings]
    report = await check_env(cfg, "reverse", log_dir=tmp_path / "logs2")
    assert report.ok and [f.check for f in report.findings] == ["health", "openenv"]
