"""A hung upstream caught while the proxy waits for a whole answer.

The proxy asks its upstream for whole answers (``rollgym.models.proxy`` says why). A whole answer
sends no byte until its generation ends, so silence alone cannot tell a long generation from a
replica that hung. ``LivenessTransport`` wraps the client's transport and, while a watched
attempt (a whole-answer chat call made inside ``watching``) has had no answer for ``every``
seconds, asks the same replica whether it is alive: a ``POST`` to its health URL, with a timeout
of its own (``Watch.probe_timeout``). Then:

1. any HTTP answer below 500 means the replica's server is up (200 from vLLM's ``/ping``, which
   takes POST and runs the check of its ``/health``; 404 from a server without the path, such
   as OpenAI, SGLang or a rollgym server): the call keeps waiting, and the replica is asked
   again ``every`` seconds later;
2. no connection, no answer within the probe's timeout, or a 5xx (vLLM's ``/ping`` answers 503
   for a dead engine) fails the attempt as a ``ReadTimeout``, the error of a stream that goes
   silent, and closes its connection (vLLM aborts a request whose client went away). The
   client's retry loop retries it under the server's policy and counts it against that
   replica's breaker; ``Replicas`` fails the call over once the replica's retries are spent;
3. the attempt's own timeout bounds the wait, as for any call.

Probes are shared: one in flight per health URL, and its result stands for ``REUSE_S`` seconds
(a failure only for attempts sent before it), so a thousand calls waiting on one replica cost
it about one probe a second. A failed probe fails every attempt waiting on its replica, so it
must mean the replica did not answer: probes go through a transport of their own
(``probe_transport``), not the pool of the calls they watch. In that pool a probe would wait
for a connection behind those calls, and a full pool of healthy long generations would fail
all of them at once. The probes' pool has no limit (there is at most one probe in flight per
health URL), so no time of a probe is spent waiting for a local connection.

What a probe cannot see: a replica whose HTTP server answers while its engine makes no progress
(vLLM's health check only reports an engine that has died). Such a call waits for the attempt
timeout; streaming from the upstream (``upstream_stream: true``) catches it sooner, at the cost
that an upstream's streamed answer may not be its whole one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from rollgym.errors import ReadTimeout, RollgymError
from rollgym.http.default import default_transport
from rollgym.http.transport import RawAnswer, Request, Transport

PROBE_TIMEOUT_S = 10.0
"""Seconds a probe may take by default (the proxy's ``probe_timeout``): a live server answers a
health check at once, but a vLLM whose API server shares a few busy cores with its engine may
take a good fraction of a second (seen on 2 CPU cores: more than 0.2 s)."""

REUSE_S = 1.0
"""Seconds a probe's result stands for every call waiting on the same replica."""

PROBE_KEEPALIVE_S = 2.0
"""Seconds a probe's connection is kept for the next probe: below the keep-alive of vLLM's
server (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s), so a probe is never sent on a connection the
replica is closing (a reset there would read as a dead replica)."""


@dataclass(frozen=True, slots=True)
class Watch:
    """How to watch one replica: its health URL (and path, for messages), probed after every
    ``every`` seconds without an answer, each probe given ``probe_timeout`` seconds."""

    url: str
    path: str
    every: float
    probe_timeout: float = PROBE_TIMEOUT_S


_WATCH: ContextVar[Watch | None] = ContextVar("rollgym_liveness_watch", default=None)


@contextmanager
def watching(watch: Watch) -> Iterator[None]:
    """Watch the attempts sent inside this block (in this task) with ``watch``."""
    token = _WATCH.set(watch)
    try:
        yield
    finally:
        _WATCH.reset(token)


class LivenessTransport:
    """The proxy's transport: ``inner``, with the attempts made inside ``watching`` watched (see
    the module docstring); every other attempt is ``inner``'s, unchanged. Probes go through
    ``probe_transport``: by default a ``default_transport()`` of their own without a pool
    limit, never ``inner``'s pool."""

    def __init__(
        self,
        inner: Transport,
        *,
        probe_transport: Transport | None = None,
        reuse: float = REUSE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.probe_transport: Transport = (
            default_transport(limit=0, keepalive_timeout=PROBE_KEEPALIVE_S)
            if probe_transport is None
            else probe_transport
        )
        self._reuse = reuse
        self._clock = clock
        self._probing: dict[str, asyncio.Task[str | None]] = {}
        self._recent: dict[str, tuple[float, str | None]] = {}  # url -> (when, problem)
        self.probes = 0
        """Probes sent, for tests and stats."""

    async def close(self) -> None:
        for transport in {id(t): t for t in (self.inner, self.probe_transport)}.values():
            close = getattr(transport, "close", None)
            if close is not None:
                await close()

    async def send(self, request: Request) -> RawAnswer:
        watch = _WATCH.get()
        if watch is None:
            return await self.inner.send(request)
        # A whole answer: silence is expected, so no idle cut; the probes below instead.
        sending = self.inner.send(request._replace(idle_timeout=None))
        attempt = asyncio.ensure_future(sending)
        headers, server = request.headers, request.server
        start = self._clock()
        try:
            while True:
                done, _ = await asyncio.wait((attempt,), timeout=watch.every)
                if done:
                    return attempt.result()
                problem = await self._probe(watch, headers, server, start)
                if problem is not None and not attempt.done():
                    waited = self._clock() - start
                    raise ReadTimeout(
                        f"{server} gave no answer in {waited:.1f}s and failed its liveness "
                        f"probe (POST {watch.path}: {problem})",
                        server=server, endpoint=request.endpoint, method="POST",
                        url=request.url,
                    )  # fmt: skip
        finally:
            if not attempt.done():
                attempt.cancel()  # closes its connection: the upstream may drop the request
                await asyncio.wait((attempt,))
            if not attempt.cancelled():
                attempt.exception()  # seen: an answer that lost the race is not an error

    async def _probe(
        self, watch: Watch, headers: Mapping[str, str] | None, server: str, since: float
    ) -> str | None:
        """What is wrong with ``watch``'s replica (``None``: it answered), asked once for
        every call waiting on it. A failure seen before ``since`` (when the asking attempt was
        sent) is not this attempt's: its retry must not fail on its predecessor's probe."""
        url = watch.url
        recent = self._recent.get(url)
        if recent is not None and self._clock() - recent[0] < self._reuse:
            when, problem = recent
            if problem is None or when >= since:
                return problem
        task = self._probing.get(url)
        if task is None:
            task = asyncio.ensure_future(self._ask(watch, headers, server))
            self._probing[url] = task
            task.add_done_callback(lambda done: self._settle(url, done))
        # Shielded: one waiter's call ending does not cancel the probe the others wait for.
        return await asyncio.shield(task)

    def _settle(self, url: str, task: asyncio.Task[str | None]) -> None:
        self._probing.pop(url, None)
        if not task.cancelled():
            self._recent[url] = (self._clock(), task.result())

    async def _ask(
        self, watch: Watch, headers: Mapping[str, str] | None, server: str
    ) -> str | None:
        self.probes += 1
        limit = watch.probe_timeout
        try:
            # The transport's own timeouts, and one around it: a probe never outlives its limit.
            async with asyncio.timeout(limit):
                answer = await self.probe_transport.send(
                    Request(watch.url, b"{}", headers, limit, limit, server, watch.path)
                )
        except TimeoutError:
            return f"no answer within {limit:g}s"
        except RollgymError as err:
            if err.type == "read_timeout":
                return f"no answer within {limit:g}s"
            return err.message  # redacted when the error was made
        if answer.status >= 500:
            return f"answered {answer.status}"
        return None
