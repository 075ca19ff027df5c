"""A key planted in the environment never reaches records, logs or run files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollgym.collect import EXIT_SOME_FAILED, Collector, prepare_run
from rollgym.config import parse_config
from rollgym.launch import Supervisor
from rollgym.testing import serve_asgi

KEY = "PLANTEDKEY0123456789abcdef"  # bare: no "Bearer"/"sk-" shape for a regex to catch


def leaky_upstream() -> Starlette:
    """An upstream that fails and echoes the credentials it received, as badly-behaved
    servers do."""

    async def chat(request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        body = {
            "error": {"message": f"bad key {auth.removeprefix('Bearer ')}", "echo": auth},
            "seen_headers": dict(request.headers),
        }
        return JSONResponse(body, status_code=500)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.timeout(60)
async def test_planted_key_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLGYM_TEST_KEY", KEY)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "\n".join(
            json.dumps({"responses_create_params": {"input": f"q{i}"}, "expected_answer": "x"})
            for i in range(6)
        )
        + "\n"
    )
    async with serve_asgi(leaky_upstream()) as upstream:
        cfg = parse_config(
            {
                "servers": {
                    "model": {
                        "kind": "model",
                        "impl": "openai_proxy",
                        "options": {
                            "base_url": upstream + "/v1",
                            "api_key_env": "ROLLGYM_TEST_KEY",
                            "upstream_retry": {"backoff_initial": 0.01, "backoff_max": 0.02},
                        },
                    },
                    "env": {"kind": "resources", "impl": "echo"},
                    "agent": {
                        "kind": "agent",
                        "impl": "tool_agent",
                        "options": {"model": "model", "resources": "env"},
                    },
                },
                "collect": {"concurrency": 3},
            }
        )
        out = tmp_path / "out"
        prepared = prepare_run(cfg, cfg.collect, tasks, out, resume=False)
        supervisor = Supervisor(cfg, log_dir=out / "logs", log_level="DEBUG")
        try:
            urls = await supervisor.start()
            outcome = await Collector(prepared, urls, progress=False).execute()
        finally:
            await supervisor.stop()
    assert outcome.exit_code == EXIT_SOME_FAILED
    assert outcome.metrics["counts"]["failed"] == 6
    assert outcome.metrics["failures"]["by_server"] == {"model.upstream": 6}
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "model.log" and p.stat().st_size > 0 for p in files)
    for path in files:
        text = path.read_text(errors="replace")
        assert KEY not in text, f"{path} contains the API key"
    failures = (out / "failures.jsonl").read_text()
    assert "REDACTED" in failures  # the echo was there, and was scrubbed
