"""HttpClient details beyond retries: decoding, error bodies, per-target state, replicas."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import orjson
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollgym.errors import (
    BODY_LIMIT,
    ConnectError,
    ConnectionLost,
    HTTPStatusError,
    ProtocolError,
    RollgymError,
)
from rollgym.http import HttpClient, Target
from rollgym.http.breaker import CLOSED, OPEN
from rollgym.http.replicas import ReplicaSet
from rollgym.http.translate import translate
from rollgym.testing import serve_asgi
from tests.support.scripted import Reply, Script, serve_script
from tests.support.stack import fast_policy

pytestmark = pytest.mark.timeout(20)


async def test_gzip_compressed_answer_is_decoded() -> None:
    # aiohttp asks for gzip by default, and GZip middleware is common in front of FastAPI apps.
    payload = {"output": [{"type": "message", "text": "hello " * 200}]}

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse(payload)

    app = Starlette(
        routes=[Route("/v1/responses", echo, methods=["POST"])],
        middleware=[Middleware(GZipMiddleware, minimum_size=10)],
    )
    async with serve_asgi(app) as url, HttpClient() as client:
        result = await client.call(Target.single("model", url, fast_policy()), "/v1/responses", {})
    assert result == payload


async def test_rollgym_error_body_keeps_the_upstream_error_as_origin() -> None:
    model_err = HTTPStatusError(
        "model answered 500", status=500, server="model", endpoint="/v1/responses", attempts=3
    )
    body = orjson.dumps(
        {
            "error": {
                "type": "upstream_error",
                "message": "model failed: NaN",
                "status": 502,
                "server": "agent",
                "retryable": False,
                "origin": model_err.to_dict(),
            }
        }
    )
    script = Script(run=lambda n: Reply(502, body))
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(HTTPStatusError) as info:
            await client.call(Target.single("agent", url, fast_policy(max_attempts=1)), "/run", {})
    err = info.value
    assert err.server == "agent" and err.status == 502
    assert "model failed: NaN" in err.message
    assert err.origin == model_err
    assert err.root().server == "model"
    assert pickle.loads(pickle.dumps(err)) == err


async def test_protocol_error_body_is_bounded_and_redacted() -> None:
    garbage = b"not json; key sk-live0123456789abcdef " + b"z" * (100 * 1024)
    script = Script(gen=lambda n: Reply(200, garbage))
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(ProtocolError) as info:
            await client.call(Target.single("m", url, fast_policy(max_attempts=1)), "/gen", {})
    err = info.value
    assert err.body is not None
    assert len(err.body) == BODY_LIMIT and err.truncated is True
    assert "sk-live0123456789abcdef" not in err.body
    assert err.body.startswith("not json; key REDACTED")


async def test_changed_policy_for_the_same_target_name_takes_effect() -> None:
    script = Script(gen=lambda n: 503)
    tight = fast_policy(max_attempts=1, breaker={"consecutive_failures": 1, "cooldown": 60})
    loose = fast_policy(max_attempts=1, breaker={"enabled": False})
    async with serve_script(script) as url, HttpClient() as client:
        with pytest.raises(HTTPStatusError):
            await client.call(Target.single("m", url, tight), "/gen", {})
        breaker = client.breaker("m")
        assert breaker is not None and breaker.state == OPEN
        # The run's config was reloaded with the breaker off: the old open breaker must not
        # keep rejecting calls that the new policy allows.
        with pytest.raises(HTTPStatusError):
            await client.call(Target.single("m", url, loose), "/gen", {})
        stats = client.stats()["m"]
    assert script.hits["/gen"] == 2
    assert stats.calls == 2  # stats survive the rebuild


async def test_replicas_share_load_and_sticky_keys_stay_put() -> None:
    one, two = Script(gen=lambda n: 200), Script(gen=lambda n: 200)
    async with serve_script(one) as url1, serve_script(two) as url2, HttpClient() as client:
        tgt = Target("model", (url1, url2), fast_policy())
        for _ in range(10):
            await client.call(tgt, "/gen", {}, sticky="rollout-7")
        assert one.hits["/gen"] + two.hits["/gen"] == 10
        assert 10 in (one.hits["/gen"], two.hits["/gen"])
        breaker = client.breaker("model")
    assert breaker is not None and breaker.state == CLOSED


def test_balancer_counts_each_replica_even_when_one_url_prefixes_another() -> None:
    short, long = "http://127.0.0.1:80", "http://127.0.0.1:8000"
    balancer = ReplicaSet((short, long))
    balancer.begin(balancer.index(long))
    # The busy replica is the long one, so the next pick is the short one (and vice versa).
    assert balancer.urls[balancer.pick()] == short
    balancer.end(balancer.index(long))
    balancer.begin(balancer.index(short))
    balancer.begin(balancer.index(short))
    assert balancer.urls[balancer.pick()] == long
    balancer.end(balancer.index(short))
    balancer.end(balancer.index(short))
    assert balancer.outstanding == [0, 0]


def test_balancer_avoids_replicas_marked_down() -> None:
    balancer = ReplicaSet(("http://a", "http://b"))
    balancer.mark_down(0)
    assert {balancer.pick() for _ in range(5)} == {1}
    balancer.mark_up(0)
    balancer.begin(1)
    assert balancer.pick() == 0


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionRefusedError(111, "Connection refused"), ConnectError),
        (ConnectionResetError(104, "Connection reset by peer"), ConnectionLost),
        (BrokenPipeError(32, "Broken pipe"), ConnectionLost),
    ],
)
def test_bare_socket_errors_translate_to_transport_errors(
    exc: BaseException, kind: type[RollgymError]
) -> None:
    err = translate(
        exc, server="m", method="POST", url="http://u:pw@h/x", endpoint="/x", timeout=1.0
    )
    assert type(err) is kind
    assert err.url == "http://h/x"
    assert pickle.loads(pickle.dumps(err)) == err


async def test_pinned_calls_never_fail_over_but_unpinned_ones_do(
    dead_url: Callable[[], str],
) -> None:
    # Replica A holds the rollout's session; when A dies, a pinned call (a tool call, /verify)
    # must fail as A's loss, not land on B and be told "unknown session".
    live = Script(verify=lambda n: Reply(200, b'{"reward": 1.0}'))
    policy = fast_policy(max_attempts=3, idempotent=True)
    async with serve_script(live) as b_url, HttpClient() as client:
        a_url = dead_url()
        target = Target("env", (a_url, b_url), policy)
        state = client._state(target)
        state.replicas.stick("rollout-7", 0)  # the session was seeded on A
        with pytest.raises(ConnectError) as info:
            await client.call(target, "/verify", {}, sticky="rollout-7", pin=True)
        assert live.hits["/verify"] == 0
        assert info.value.url is not None and info.value.url.startswith(a_url)
        assert info.value.retryable is False
        # A call with no state on A (a model call, a new session) goes to B.
        assert await client.call(target, "/verify", {}, sticky="rollout-8") == {"reward": 1.0}
        assert live.hits["/verify"] == 1
