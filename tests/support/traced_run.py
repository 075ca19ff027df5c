"""A real ``rollgym run`` whose processes export traces: its config (``openai_proxy`` in front of
``ChatUpstream``, behind the chaos proxy's first two 503s), tasks and command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.testing import in_thread, serve_asgi
from tests.support.otlp import ReceivedSpan
from tests.support.stack import FAST_RETRY, stack_data, write_tasks

REPO = Path(__file__).resolve().parents[2]
ROLLGYM = str(Path(sys.executable).parent / "rollgym")
ROLLOUTS = 4
INJECTED = 2


class ChatUpstream:
    """Chat completions like vLLM's: call the first tool offered until a tool has answered,
    then say the answer the tool gave."""

    def __init__(self) -> None:
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.traceparents: list[str | None] = []

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.traceparents.append(request.headers.get("traceparent"))
        messages = body["messages"]
        tools = body.get("tools") or []
        message: dict[str, Any] = {"role": "assistant", "content": None}
        done = [m for m in messages if m["role"] == "tool"]
        if tools and not done:
            user = next(m["content"] for m in messages if m["role"] == "user")
            index = re.search(r"task (\d+)", str(user))
            text = f"v{index.group(1) if index else 0}"
            message["tool_calls"] = [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "echo", "arguments": json.dumps({"text": text})},
                }
            ]
            finish = "tool_calls"
        else:
            message["content"] = f"The answer is {done[-1]['content'] if done else ''}"
            finish = "stop"
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": body.get("model", "upstream"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
            }
        )


@asynccontextmanager
async def serving(upstream: ChatUpstream) -> AsyncIterator[str]:
    async with serve_asgi(upstream.app) as url:
        yield url


@contextmanager
def upstream_served() -> Iterator[tuple[str, ChatUpstream]]:
    """A ``ChatUpstream`` served on a thread of this process (it answers while a test waits
    for a ``rollgym run``); yields its URL and itself."""
    upstream = ChatUpstream()
    with in_thread(serving(upstream)) as url:
        yield url, upstream


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any OpenTelemetry setting of its own, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, "PYTHONPATH": str(REPO), "COLUMNS": "1000", **extra}


def write_run(tmp_path: Path, upstream: str) -> tuple[Path, Path]:
    model = {
        "impl": "openai_proxy",
        "options": {"base_url": f"{upstream}/v1", "upstream_retry": FAST_RETRY},
        "chaos": {"sequence": [503] * INJECTED, "paths": ["/v1/responses"]},
    }
    data = stack_data({"concurrency": 2}, model=model)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    return config, write_tasks(tmp_path / "tasks.jsonl", ROLLOUTS)


def by_trace(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    traces: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for s in spans:
        traces[s.trace_id].append(s)
    return traces


def run_with_traces(tmp_path: Path, upstream: str, **env: str) -> subprocess.CompletedProcess[str]:
    config, tasks = write_run(tmp_path, upstream)
    return subprocess.run(
        [ROLLGYM, "run", str(config), "--input", str(tasks), "--output", str(tmp_path / "out")],
        env=clean_env(**env), capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
