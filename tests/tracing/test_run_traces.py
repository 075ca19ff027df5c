"""Traces of a real run: ``rollgym run`` launches the servers as processes, each process exports
its spans with the real OTLP/HTTP exporter (configured by the standard variables alone) to a
receiver this test serves on 127.0.0.1, which decodes them with the official protobuf classes.

The model server is ``openai_proxy`` in front of a small chat-completions upstream served by
this test (it calls the echo tool, then says the answer), behind the chaos proxy: the first two
``/v1/responses`` calls answer 503, so two attempts fail and are retried.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.testing import in_thread, serve_asgi
from tests.support.ledger import read_jsonl
from tests.support.otlp import ReceivedSpan, otlp_env, otlp_receiver
from tests.support.stack import FAST_RETRY, stack_data, write_tasks

pytestmark = pytest.mark.timeout(150)

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


@pytest.fixture
def upstream_url() -> Iterator[tuple[str, ChatUpstream]]:
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


def test_a_run_makes_one_trace_per_rollout_across_every_process(
    tmp_path: Path, upstream_url: tuple[str, ChatUpstream]
) -> None:
    url, upstream = upstream_url
    with otlp_receiver() as receiver:
        done = run_with_traces(tmp_path, url, **otlp_env(receiver))
        assert done.returncode == 0, done.stderr[-3000:]
        # Every process flushes its batch at exit; the run has exited, so all have been sent
        # (the wait is only for the receiver's thread to have stored the last ones).
        receiver.wait_until(
            lambda spans: sum(s.name == "rollout" for s in spans) >= ROLLOUTS, timeout=15
        )
        spans = receiver.snapshot()
    rollouts = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    assert len(rollouts) == ROLLOUTS and all(r["reward"] == 1.0 for r in rollouts)

    assert {s.service for s in spans} == {
        "rollgym-collector",
        "rollgym-agent",
        "rollgym-model",
        "rollgym-env",
    }
    traces = by_trace(spans)
    assert len(traces) == ROLLOUTS, "one trace per rollout, and no span outside them"
    keys: set[str] = set()
    failed_attempts: list[ReceivedSpan] = []
    for trace in traces.values():
        ids = {s.span_id for s in trace}
        [root] = [s for s in trace if not s.parent_id]
        assert (root.name, root.service) == ("rollout", "rollgym-collector")
        key = root.attributes["rollgym.rollout"]
        keys.add(key)
        assert root.attributes["rollgym.outcome"] == "scored"
        for s in trace:
            # Connected: every span's parent is in the same trace, across processes.
            assert s is root or s.parent_id in ids, (s.name, s.service)
            # And no trace mixes two rollouts.
            assert s.attributes.get("rollgym.rollout", key) == key
        parent = {s.span_id: s for s in trace}
        hops = {
            (s.service, s.name, parent[s.parent_id].service) for s in trace if s.kind == "server"
        }
        # collector -> agent -> model, and agent -> env for the seed, the tool and the verify.
        assert hops == {
            ("rollgym-agent", "POST /run", "rollgym-collector"),
            ("rollgym-model", "POST /v1/responses", "rollgym-agent"),
            ("rollgym-env", "POST /seed_session", "rollgym-agent"),
            ("rollgym-env", "POST /echo", "rollgym-agent"),
            ("rollgym-env", "POST /verify", "rollgym-agent"),
        }
        # The model server's upstream call, in the model server, under its server span.
        upstream_calls = [s for s in trace if s.name == "model.upstream /chat/completions"]
        assert len(upstream_calls) == 2  # the tool call, then the answer
        for call in upstream_calls:
            assert call.service == "rollgym-model"
            assert parent[call.parent_id].name == "POST /v1/responses"
            [attempt] = [s for s in trace if s.parent_id == call.span_id]
            assert attempt.kind == "client"
            assert attempt.attributes["http.response.status_code"] == 200
        failed_attempts += [s for s in trace if s.kind == "client" and s.error]

    assert keys == {f"{i}:0" for i in range(ROLLOUTS)}
    # The chaos proxy's two 503s: failed attempts of the agent's model calls, each retried
    # after a wait span, and followed by an attempt that succeeded.
    assert len(failed_attempts) == INJECTED
    for attempt in failed_attempts:
        assert attempt.service == "rollgym-agent"
        assert attempt.name == "POST /v1/responses"
        assert attempt.attributes["http.response.status_code"] == 503
        assert attempt.attributes["error.type"] == "http_status"
        assert attempt.attributes["rollgym.will_retry"] is True
        trace = traces[attempt.trace_id]
        siblings = [s for s in trace if s.parent_id == attempt.parent_id]
        number = attempt.attributes["rollgym.attempt"]
        waits = [
            s
            for s in siblings
            if s.name == "http.retry_wait" and s.attributes["rollgym.attempt"] == number
        ]
        assert len(waits) == 1 and waits[0].start_ns >= attempt.end_ns
        [after] = [
            s
            for s in siblings
            if s.kind == "client" and s.attributes["rollgym.attempt"] == number + 1
        ]
        assert after.start_ns >= waits[0].end_ns
    # The upstream saw trace context too (it could join the trace if it traced).
    assert all(tp and tp.startswith("00-") for tp in upstream.traceparents)


def test_without_the_variable_no_process_traces(
    tmp_path: Path, upstream_url: tuple[str, ChatUpstream]
) -> None:
    url, upstream = upstream_url
    with otlp_receiver() as receiver:
        # Everything but the switch: OTEL_TRACES_EXPORTER unset means off.
        env = otlp_env(receiver)
        del env["OTEL_TRACES_EXPORTER"]
        done = run_with_traces(tmp_path, url, **env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert receiver.requests == 0
    assert len(read_jsonl(tmp_path / "out" / "rollouts.jsonl")) == ROLLOUTS
    assert upstream.traceparents and not any(upstream.traceparents)


def test_asking_for_traces_without_a_known_exporter_stops_the_run_before_it_starts(
    tmp_path: Path, upstream_url: tuple[str, ChatUpstream]
) -> None:
    url, _ = upstream_url
    done = run_with_traces(tmp_path, url, OTEL_TRACES_EXPORTER="jaegerr")
    assert done.returncode != 0
    assert "OTEL_TRACES_EXPORTER='jaegerr'" in done.stderr
    assert "no installed exporter is named 'jaegerr'" in done.stderr
    assert not (tmp_path / "out" / "rollouts.jsonl").exists()
