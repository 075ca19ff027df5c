"""Traces of a real run: ``rollgym run`` launches the servers as processes, each process exports
its spans with the real OTLP/HTTP exporter (configured by the standard variables alone) to a
receiver this test serves on 127.0.0.1, which decodes them with the official protobuf classes.

The model server is ``openai_proxy`` in front of a small chat-completions upstream served by
this test (it calls the echo tool, then says the answer), behind the chaos proxy: the first two
``/v1/responses`` calls answer 503, so two attempts fail and are retried.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.ledger import read_jsonl
from tests.support.otlp import ReceivedSpan, otlp_env, otlp_receiver
from tests.support.traced_run import INJECTED, ROLLOUTS, ChatUpstream, by_trace, run_with_traces

pytestmark = pytest.mark.timeout(150)


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
