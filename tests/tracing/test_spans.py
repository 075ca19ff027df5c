"""Traces in one process: the three servers on real sockets, the real HTTP client and the rollout
core, spans caught by the SDK's in-memory exporter. Context crosses every hop as a
``traceparent`` header, exactly as between processes (each server span is made from the header
it received, never from this process's current span)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym import tracing
from rollgym.collect.records import FailedRollout, RolloutItem, ScoredRollout
from rollgym.collect.rollout import RolloutPolicy, RolloutRunner
from rollgym.errors import RollgymError
from rollgym.http import HttpClient, Target
from rollgym.testing import serve_asgi
from rollgym.tracing import names as n
from rollgym.wire import POLICY_VERSION
from tests.support.servers import FAIL_MARKER
from tests.support.stack import fast_policy, running_stack, task_row

pytestmark = pytest.mark.timeout(60)

SECRET = "sk-abcdefghijklmnopqrstuvwx0123456789"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, into memory; off again after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def item(index: int, *, fail: bool = False) -> RolloutItem:
    row = {**task_row(index, fail=fail), "task_index": index, "rollout_index": 0}
    return RolloutItem(index, 0, orjson.dumps(row), "agent")


def by_trace(finished: tuple[ReadableSpan, ...]) -> dict[int, list[ReadableSpan]]:
    traces: dict[int, list[ReadableSpan]] = defaultdict(list)
    for s in finished:
        assert s.context is not None
        traces[s.context.trace_id].append(s)
    return traces


def parent_of(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    [parent] = [
        s for s in spans if s.context is not None and s.context.span_id == span.parent.span_id
    ]
    return parent


def attr(span: ReadableSpan, key: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(key)


async def run_items(stack_urls: dict[str, list[str]], items: list[RolloutItem]) -> list[Any]:
    agent = Target.single("agent", stack_urls["agent"][0], fast_policy("agent"))
    async with HttpClient() as http:
        runner = RolloutRunner(http, {"agent": agent}, RolloutPolicy(timeout=30))
        return [await runner.run(i) for i in items]


async def test_each_rollout_is_one_trace_through_every_hop(spans: InMemorySpanExporter) -> None:
    async with running_stack() as stack:
        records = await run_items(stack.urls, [item(0), item(1)])
    assert all(isinstance(r, ScoredRollout) and r.reward == 1.0 for r in records)
    traces = by_trace(spans.get_finished_spans())
    assert len(traces) == 2, "one trace per rollout, nothing else"
    keys = set()
    for trace_spans in traces.values():
        [root] = [s for s in trace_spans if s.parent is None]
        assert root.name == n.ROLLOUT_SPAN
        key = attr(root, n.ROLLOUT)
        keys.add(key)
        assert (attr(root, n.OUTCOME), attr(root, n.REWARD)) == ("scored", 1.0)
        # Every span hangs from the root, and names no other rollout.
        for s in trace_spans:
            assert s is root or parent_of(s, trace_spans) is not None
            assert attr(s, n.ROLLOUT) in (None, key)
        servers = {(attr(s, n.SERVER), s.name) for s in trace_spans if s.kind == SpanKind.SERVER}
        assert servers == {
            ("agent", "POST /run"),
            ("model", "POST /v1/responses"),
            ("env", "POST /seed_session"),
            ("env", "POST /echo"),
            ("env", "POST /verify"),
        }
        # Each server span is the child of the client attempt that reached it, itself a child
        # of the call: rollout -> agent /run -> POST /run -> [agent] POST /run -> model ...
        for server in (s for s in trace_spans if s.kind == SpanKind.SERVER):
            attempt = parent_of(server, trace_spans)
            assert attempt is not None and attempt.kind == SpanKind.CLIENT
            assert attr(attempt, n.HTTP_STATUS) == 200
            call = parent_of(attempt, trace_spans)
            assert call is not None and call.name == n.call_span(
                attr(server, n.SERVER), server.name[5:]
            )
        [agent_span] = [
            s for s in trace_spans if s.kind == SpanKind.SERVER and s.name == "POST /run"
        ]
        model_call = next(s for s in trace_spans if s.name == "model /v1/responses")
        assert parent_of(model_call, trace_spans) is agent_span
    assert keys == {"0:0", "1:0"}


async def test_retries_are_attempt_spans_with_waits_and_the_failure_has_its_type(
    spans: InMemorySpanExporter,
) -> None:
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        [record] = await run_items(stack.urls, [item(3, fail=True)])
    assert isinstance(record, FailedRollout)
    [trace_spans] = by_trace(spans.get_finished_spans()).values()
    [call] = [s for s in trace_spans if s.name == "model /v1/responses"]
    attempts = sorted(
        (s for s in trace_spans if s.kind == SpanKind.CLIENT and parent_of(s, trace_spans) is call),
        key=lambda s: attr(s, n.ATTEMPT),
    )
    assert [attr(s, n.ATTEMPT) for s in attempts] == [1, 2, 3]  # the model's policy: 3 attempts
    assert [attr(s, n.WILL_RETRY) for s in attempts] == [True, True, False]
    for s in attempts:
        assert s.status.status_code == StatusCode.ERROR
        assert (attr(s, n.ERROR_TYPE), attr(s, n.HTTP_STATUS)) == ("http_status", 500)
    waits = [s for s in trace_spans if s.name == n.RETRY_WAIT_SPAN]
    assert sorted(attr(s, n.ATTEMPT) for s in waits) == [1, 2]
    assert all(parent_of(s, trace_spans) is call for s in waits)
    # Each wait lies between the attempt it follows and the next one.
    for w in waits:
        before, after = attempts[attr(w, n.ATTEMPT) - 1], attempts[attr(w, n.ATTEMPT)]
        assert before.end_time is not None and w.start_time is not None
        assert before.end_time <= w.start_time and w.end_time <= after.start_time  # type: ignore[operator]
    assert call.status.status_code == StatusCode.ERROR
    assert (attr(call, n.ATTEMPTS), attr(call, n.ERROR_SERVER)) == (3, "model")
    [root] = [s for s in trace_spans if s.parent is None]
    assert root.status.status_code == StatusCode.ERROR
    assert attr(root, n.OUTCOME) == "failed"
    assert attr(root, n.ERROR_TYPE) == record.error.type
    assert root.status.description and root.status.description.startswith(record.error.type)
    # The agent answered the failure as an error body: its server span says so too.
    [agent_span] = [
        s for s in trace_spans if s.kind == SpanKind.SERVER and attr(s, n.SERVER) == "agent"
    ]
    assert agent_span.status.status_code == StatusCode.ERROR
    assert attr(agent_span, n.HTTP_STATUS) == 502
    # The agent's own answer: the model's failure, passed on as the origin of its 502.
    assert attr(agent_span, n.ERROR_TYPE) == "upstream_error"


async def test_no_credentials_headers_or_bodies_in_any_span(spans: InMemorySpanExporter) -> None:
    seen: list[dict[str, str]] = []

    async def answer(request: Request) -> JSONResponse:
        seen.append(dict(request.headers))
        return JSONResponse({"ok": True, POLICY_VERSION: 7})

    # An upstream whose URL holds a key (as some hosted APIs' do), called with a bearer token.
    app = Starlette(routes=[Route("/{key}/v1/responses", answer, methods=["POST"])])
    async with serve_asgi(app) as url, HttpClient() as http:
        target = Target.single("upstream", f"{url}/{SECRET}", fast_policy())
        body = {"input": "the prompt text PRIVATE-PROMPT", "api_key": SECRET}
        with tracing.span("caller"):  # a call is traced inside a trace (a rollout's, a request's)
            got = await http.call(
                target, "/v1/responses", body, headers={"Authorization": f"Bearer {SECRET}"}
            )
    assert got["ok"] is True
    # The header went out with the trace context beside the caller's own headers.
    assert seen[0]["authorization"] == f"Bearer {SECRET}"
    assert seen[0]["traceparent"].startswith("00-")
    finished = spans.get_finished_spans()
    assert {s.name for s in finished} == {"caller", "upstream /v1/responses", "POST /v1/responses"}
    [call] = [s for s in finished if s.name == "upstream /v1/responses"]
    assert attr(call, n.POLICY_VERSION) == 7
    dumped = repr([(s.name, dict(s.attributes or {}), s.status.description) for s in finished])
    assert SECRET not in dumped and "PRIVATE-PROMPT" not in dumped
    assert "authorization" not in dumped.lower()
    [attempt] = [s for s in finished if s.kind == SpanKind.CLIENT]
    assert str(attr(attempt, n.URL_FULL)).startswith("http://127.0.0.1:")


async def test_a_server_reached_without_trace_context_starts_its_own_trace(
    spans: InMemorySpanExporter,
) -> None:
    row = {**task_row(5), "task_index": 5, "rollout_index": 0}
    # A caller that does not trace (another program calling /run): no traceparent.
    async with (
        running_stack() as stack,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
    ):
        answer = await session.post(f"{stack.agent_url}/run", json=row)
        assert answer.status == 200
        answer.release()
    [trace_spans] = by_trace(spans.get_finished_spans()).values()
    [root] = [s for s in trace_spans if s.parent is None]
    assert (root.name, root.kind, attr(root, n.SERVER)) == ("POST /run", SpanKind.SERVER, "agent")
    assert {attr(s, n.SERVER) for s in trace_spans if s.kind == SpanKind.SERVER} == {
        "agent",
        "model",
        "env",
    }


async def test_a_rollout_never_joins_its_callers_trace_but_links_to_it(
    spans: InMemorySpanExporter,
) -> None:
    from opentelemetry import trace

    tracer = trace.get_tracer("trainer", tracer_provider=tracing.active.provider)  # type: ignore[union-attr]
    async with running_stack() as stack:
        with tracer.start_as_current_span("training step") as step:
            await run_items(stack.urls, [item(0), item(1)])
    finished = spans.get_finished_spans()
    roots = [s for s in finished if s.name == n.ROLLOUT_SPAN]
    assert len(roots) == 2 and len({s.context.trace_id for s in roots if s.context}) == 2
    step_id = step.get_span_context()
    for root in roots:
        assert root.parent is None
        assert root.context is not None and root.context.trace_id != step_id.trace_id
        assert [link.context.span_id for link in root.links] == [step_id.span_id]


async def test_a_circuit_hold_is_a_span_of_the_rollout(spans: InMemorySpanExporter) -> None:
    breaker = {"enabled": True, "consecutive_failures": 1, "cooldown": 0.2}
    async with running_stack(model_options={"fail_marker": FAIL_MARKER}) as stack:
        # A "agent" target whose breaker one failed call opens (the model's 500, 3 times).
        target = Target.single(
            "agent", stack.urls["model"][0], fast_policy("model", breaker=breaker)
        )
        async with HttpClient() as http:
            with pytest.raises(RollgymError):
                await http.call(target, "/v1/responses", {"input": FAIL_MARKER})
            breaker_state = http.breaker("agent")
            assert breaker_state is not None and breaker_state.state == "open"
            # The circuit is open: the rollout is held, then re-sent as the half-open probe
            # (the model server has no /run: a 404 ends it).
            policy = RolloutPolicy(timeout=30, circuit_waits=(0.3,))
            record = await RolloutRunner(http, {"agent": target}, policy).run(item(9))
    assert isinstance(record, FailedRollout)
    assert record.error.status == 404
    holds = [s for s in spans.get_finished_spans() if s.name == n.CIRCUIT_HOLD_SPAN]
    assert len(holds) == 1
    assert attr(holds[0], n.DELAY) == 0.3
    [root] = [s for s in spans.get_finished_spans() if s.name == n.ROLLOUT_SPAN]
    assert holds[0].parent is not None and root.context is not None
    assert holds[0].parent.span_id == root.context.span_id


async def test_calls_outside_any_trace_and_probes_make_no_span(
    spans: InMemorySpanExporter,
) -> None:
    async with running_stack() as stack, HttpClient() as http:
        # What the launcher does at start-up and the run's end: health waits, /stats reads.
        for name, urls in stack.urls.items():
            target = Target.single(name, urls[0], fast_policy())
            await http.call(target, "/health", {})
            await http.call(target, "/stats", {})
    assert spans.get_finished_spans() == ()


def test_names_of_a_call_and_an_attempt() -> None:
    assert n.call_span("model", "/v1/responses") == "model /v1/responses"
    assert n.attempt_span("/run") == "POST /run"


async def test_a_rollout_the_sampler_leaves_out_makes_no_span_in_any_server() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)  # as OTEL_TRACES_SAMPLER=always_off
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    seen: list[str | None] = []

    async def answer(request: Request) -> JSONResponse:
        seen.append(request.headers.get("traceparent"))
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/v1/responses", answer, methods=["POST"])])
    try:
        async with running_stack() as stack:
            [record] = await run_items(stack.urls, [item(0)])
        async with serve_asgi(app) as url, HttpClient() as http:
            with tracing.span("caller"):
                await http.call(Target.single("up", url, fast_policy()), "/v1/responses", {})
    finally:
        tracing.disable()
        provider.shutdown()
    assert isinstance(record, ScoredRollout)
    assert exporter.get_finished_spans() == ()
    # The context still went on, flagged "not sampled", so downstream servers leave it out too.
    [sent] = seen
    assert sent is not None and sent.startswith("00-")
    assert int(sent.rsplit("-", 1)[1], 16) & 1 == 0  # the "sampled" flag is off


async def test_a_nemo_gym_prefixed_path_names_the_rollout_and_the_endpoint(
    spans: InMemorySpanExporter,
) -> None:
    row = task_row(4)
    async with running_stack() as stack, HttpClient() as http:
        env = Target.single("env", stack.urls["env"][0], fast_policy("resources"))
        with tracing.span("caller"):
            await http.call_with_cookies(env, "/ng-rollout/4-0/seed_session", row)
    [served] = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    # The span is the endpoint's (few names, whatever the ids), with 0.7's rollout id.
    assert served.name == "POST /seed_session"
    assert (attr(served, n.URL_PATH), attr(served, n.ROLLOUT)) == ("/seed_session", "4-0")
