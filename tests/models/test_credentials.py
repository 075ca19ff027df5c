"""Credentials in the proxy's ``base_url``: sent as basic auth, never combined with an API key,
never written to ``run.json``."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import orjson
import pytest

from rollgym.config import parse_config
from rollgym.errors import ConfigError
from rollgym.server.base import check_servers
from rollgym.testing import serve_asgi, serve_server

from .test_proxy import FakeUpstream

pytestmark = pytest.mark.timeout(20)

KEY_ENV = "ROLLGYM_TEST_CRED_KEY"


def config(base_url: str, **options: object) -> dict[str, object]:
    return {
        "servers": {
            "model": {
                "kind": "model",
                "impl": "openai_proxy",
                "options": {"base_url": base_url, **options},
            }
        }
    }


def test_credentials_in_base_url_with_api_key_env_is_refused_before_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "a-key-value-123")
    cfg = parse_config(config("http://user:hunter22@gpu:8000/v1", api_key_env=KEY_ENV), "c.yaml")
    with pytest.raises(ConfigError) as info:
        check_servers(cfg)
    message = str(info.value)
    assert "servers.model.options" in message and "api_key_env" in message
    assert "hunter22" not in message


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    async with serve_asgi(fake.app) as url:
        fake.url = url
        yield fake


async def test_credentials_in_base_url_reach_the_upstream_as_basic_auth(
    upstream: FakeUpstream,
) -> None:
    base = upstream.url.replace("http://", "http://user:hunter22@") + "/v1"
    options = {"base_url": base, "upstream_retry": {"max_attempts": 1}}
    async with (
        serve_server("openai_proxy", name="model", options=options) as (url, _),
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        response = await sdk.responses.create(model="m", input="hi")
        upstream.fail_always = 500
        with pytest.raises(openai.InternalServerError) as info:
            await sdk.responses.create(model="m", input="hi")
    assert response.output_text == "echo: hi"
    expected = "Basic " + base64.b64encode(b"user:hunter22").decode()
    assert upstream.headers[0]["authorization"] == expected
    assert b"hunter22" not in orjson.dumps(info.value.body)


def test_the_config_written_to_run_json_holds_no_credentials() -> None:
    cfg = parse_config(config("http://user:hunter22@gpu:8000/v1"), "c.yaml")
    dumped = orjson.dumps(cfg.model_dump(mode="json"))
    assert b"hunter22" not in dumped
    assert b"gpu:8000" in dumped
    # The launchers hand the real URL to the server processes, which need it.
    kept = orjson.dumps(cfg.model_dump(mode="json", context={"keep_secrets": True}))
    assert b"user:hunter22@gpu:8000" in kept


async def test_a_run_json_never_holds_the_credentials(tmp_path: Path) -> None:
    from rollgym.collect import prepare_run

    data = config("http://user:hunter22@gpu:8000/v1")
    servers = data["servers"]
    assert isinstance(servers, dict)
    servers["agent"] = {"kind": "agent", "url": "http://127.0.0.1:9"}  # rows need an agent
    cfg = parse_config(data, str(tmp_path / "c.yaml"))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(orjson.dumps({"responses_create_params": {"input": "hi"}}) + b"\n")
    prepare_run(cfg, cfg.collect, tasks, tmp_path / "out", resume=False)
    assert b"hunter22" not in (tmp_path / "out" / "run.json").read_bytes()
