"""Turning traces on and off: the standard variables, clear errors, nothing imported when off;
and the spans of the environments' own work (a sandbox run, a judge call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rollgym import tracing
from rollgym.envs.code.sandbox import Limits, Sandbox, probe_isolation
from rollgym.envs.judge.server import JudgeEnv
from rollgym.errors import ConfigError
from rollgym.http import Target
from rollgym.models.scripted import ScriptedModel
from rollgym.testing import serve_server
from rollgym.tracing import names as n
from rollgym.tracing.exporting import exporter_classes, provider_from_env
from tests.envs.env_client import EnvClient
from tests.support.stack import fast_policy

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


# -- the switch --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": " None "}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        # An endpoint alone is not the switch: a machine-wide endpoint for other programs must
        # not turn rollgym's traces on.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ],
)
def test_the_standard_variable_is_the_switch(env: dict[str, str], on: bool) -> None:
    assert tracing.requested(env) is on


def test_exporters_are_the_sdks_entry_points_with_the_sdks_protocol_rule() -> None:
    assert exporter_classes({"OTEL_TRACES_EXPORTER": "otlp"}) == [GrpcExporter]
    http = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert exporter_classes(http) == [HttpExporter]
    # The per-signal protocol wins over the general one, as in the SDK.
    assert exporter_classes({**http, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}) == [
        GrpcExporter
    ]
    assert exporter_classes({"OTEL_TRACES_EXPORTER": "console, otlp_proto_http"}) == [
        ConsoleSpanExporter,
        HttpExporter,
    ]


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaegerr"}, "no installed exporter is named 'jaegerr'"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='http/json': not an OTLP protocol",
        ),
    ],
)
def test_a_wrong_exporter_setting_is_a_clear_error(env: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        exporter_classes(env)


def test_the_service_is_named_by_the_process_unless_the_variable_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = provider_from_env("rollgym-agent")
    assert provider.resource.attributes["service.name"] == "rollgym-agent"
    provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "grpo-run-7")
    provider = provider_from_env("rollgym-agent")
    assert provider.resource.attributes["service.name"] == "grpo-run-7"
    provider.shutdown()


OFF_PROGRAM = """
import asyncio, json, sys
import orjson
from rollgym import tracing
from rollgym.collect.records import RolloutItem
from rollgym.collect.rollout import RolloutPolicy, RolloutRunner
from rollgym.http import HttpClient, Target
from tests.support.stack import fast_policy, running_stack, task_row

async def main():
    assert tracing.setup("rollgym-test") is False
    async with running_stack() as stack, HttpClient() as http:
        agent = Target.single("agent", stack.agent_url, fast_policy("agent"))
        runner = RolloutRunner(http, {"agent": agent}, RolloutPolicy(timeout=30))
        row = {**task_row(0), "task_index": 0, "rollout_index": 0}
        record = await runner.run(RolloutItem(0, 0, orjson.dumps(row), "agent"))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"reward": record.reward, "opentelemetry": loaded}))

asyncio.run(main())
"""


def test_off_means_opentelemetry_is_never_imported() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", OFF_PROGRAM], env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"reward": 1.0, "opentelemetry": []}


def test_asking_for_traces_without_opentelemetry_installed_says_how_to_get_it() -> None:
    # The extra missing: opentelemetry made unimportable in a fresh interpreter.
    program = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from rollgym import tracing\n"
        "tracing.setup('x')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", program], env={**env, "OTEL_TRACES_EXPORTER": "otlp"},
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert "ConfigError" in done.stderr
    assert "pip install 'rollgym[trace]'" in done.stderr


# -- the environments' own spans ---------------------------------------------------------------


async def test_a_sandbox_run_is_a_span_with_how_the_program_ended(
    spans: InMemorySpanExporter,
) -> None:
    sandbox = Sandbox(
        Limits(wall_seconds=10.0, cpu_seconds=5), parallel=1, uid_base=60000,
        isolation=probe_isolation(), server="code",
    )  # fmt: skip
    ok = await sandbox.run("print(input())", "hi\n")
    bad = await sandbox.run("raise SystemExit(3)", "")
    assert (ok.exit_code, bad.exit_code) == (0, 3)
    runs = [s for s in spans.get_finished_spans() if s.name == n.SANDBOX_SPAN]
    assert [(s.attributes or {}).get(n.SANDBOX_EXIT) for s in runs] == [0, 3]
    for s in runs:
        attributes = s.attributes or {}
        assert attributes[n.SANDBOX_MODE] == "stdio" and attributes[n.SERVER] == "code"
        assert attributes[n.SANDBOX_TIMED_OUT] is False
        # The program's text and its input are no attribute.
        assert "print(input())" not in repr(attributes) and "hi" not in repr(attributes)


async def test_a_judge_call_is_a_span_around_the_judge_models_call(
    spans: InMemorySpanExporter,
) -> None:
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "Capital?"}]},
        "expected_answer": "Paris",
    }
    judge_params = {"metadata": {"rollgym_script": json.dumps([{"say": "[[A=B]]"}])}}
    timeout = aiohttp.ClientTimeout(total=30, connect=5)
    async with (
        serve_server(ScriptedModel, name="judge_model") as (jurl, _),
        aiohttp.ClientSession(timeout=timeout) as session,
    ):
        peers = {"judge_model": Target("judge_model", (jurl,), fast_policy("model"))}
        opts = {"judge": "judge_model", "judge_params": judge_params}
        async with serve_server(JudgeEnv, name="judge", options=opts, peers=peers) as (url, _):
            status, body = await EnvClient(session, url).verify(row, "Paris")
    assert status == 200 and body["reward"] == 1.0
    finished = spans.get_finished_spans()
    [judge] = [s for s in finished if s.name == n.JUDGE_SPAN]
    assert (judge.attributes or {})[n.JUDGE] == "judge_model"
    assert judge.status.status_code != StatusCode.ERROR
    [call] = [s for s in finished if s.name == "judge_model /v1/responses"]
    assert call.parent is not None and judge.context is not None
    assert call.parent.span_id == judge.context.span_id
    # The judge model's server span continues the same trace (its traceparent).
    [served] = [s for s in finished if s.kind == SpanKind.SERVER and s.name == "POST /v1/responses"]
    assert served.context is not None and judge.context.trace_id == served.context.trace_id


async def test_off_the_block_spans_are_nothing_and_the_sandbox_runs_as_before() -> None:
    assert tracing.active is None
    with tracing.span(n.SANDBOX_SPAN, {n.SERVER: "code"}) as span:
        assert span is None
    sandbox = Sandbox(
        Limits(wall_seconds=10.0, cpu_seconds=5), parallel=1, uid_base=60000,
        isolation=probe_isolation(), server="code",
    )  # fmt: skip
    result = await sandbox.run("print(input())", "hi\n")
    assert (result.exit_code, result.stdout) == (0, "hi\n")
