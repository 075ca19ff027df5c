"""The transport seam: one ``Request`` in, one ``RawAnswer`` out; the default transport's pair;
the client's ``on_attempt`` hook (the agent's hop timing)."""

from __future__ import annotations

import pytest

from rollgym.errors import ConnectError, TransportError
from rollgym.http import (
    AiohttpTransport,
    HttpClient,
    LeanTransport,
    Request,
    Target,
    default_transport,
)
from tests.http.fake_transport import Fail, FakeTransport
from tests.support.stack import fast_policy

pytestmark = pytest.mark.timeout(10)


def test_the_default_transport_is_the_lean_one_with_aiohttp_behind_it() -> None:
    t = default_transport(limit=3, keepalive_timeout=2.0)
    assert isinstance(t, LeanTransport) and (t.limit, t.keepalive_timeout) == (3, 2.0)
    assert isinstance(t.fallback, AiohttpTransport)
    assert isinstance(HttpClient()._transport, LeanTransport)


async def test_a_lean_transport_without_a_fallback_refuses_https_at_once() -> None:
    t = LeanTransport()
    request = Request("https://api.example/v1/x", b"{}", None, 1.0, 1.0, "up", "/v1/x")
    with pytest.raises(TransportError, match="no fallback transport") as caught:
        await t.send(request)
    assert not caught.value.retryable and caught.value.server == "up"
    await t.close()


async def test_on_attempt_hears_of_every_attempt_sent_answered_or_not() -> None:
    fake = FakeTransport([503, Fail(ConnectError), 200])
    seen: list[float] = []
    policy = fast_policy(max_attempts=3, backoff_initial=0, backoff_max=0)
    async with HttpClient(transport=fake, on_attempt=seen.append) as http:
        assert (await http.call(Target("env", ("http://h",), policy), "/x", {}))["ok"]
    assert len(seen) == 3 == len(fake.sent) and all(s >= 0 for s in seen)
