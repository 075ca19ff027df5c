"""Policy control: tell every rollgym model server which weights are live, and hold model calls
while the trainer swaps them.

    control = PolicyControl(["http://10.0.0.7:9000", "http://10.0.0.8:9000"])
    await control.pause(abort=True, timeout_s=120)   # every server holds new model calls
    ...                                              # swap the weights on the inference servers
    await control.resume(3, max_staleness=1)         # version 3 is live; held calls go on

Each call goes to every model server at once (``/rollgym/pause``, ``/rollgym/resume``: see
``rollgym.wire``), bounded by ``call_timeout`` seconds, through rollgym's HTTP client (so its
errors are the typed ones: a server that does not answer is a ``DeadlineExceeded`` or a
``ConnectError`` naming it, never a hang). A pause without ``abort`` waits at each server for
its model calls in flight to finish, so it may take up to its ``timeout_s`` (plus
``call_timeout``). A pause is all or nothing: when any server fails to pause (no answer, an
error, or a pause that expired before it answered), every server is released at the version it
runs (read from it; a server whose pause request was dropped undoes that pause itself) and the
first server's error is raised (each one is logged). A resume that some server refuses raises
the same way; the servers that took it run the new version (versions never go back, so a
retried resume is safe). Pauses and resumes from one control go out one at a time, in order.
``release()`` unpauses every server at its own version (and may lift the staleness bound):
what a stream does when it closes.

Pauses and resumes carry the control token (``rollgym.control_token``): the user's own unless
``token`` names another (the servers' user's, when it differs).

A server holds a pause for at most ``timeout_s`` (its own deadline): then its held calls fail as
``PausedTooLong``. A trainer that dies mid-pause leaves no server held forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollgym.config import RetryPolicy
from rollgym.control_token import authorization, control_token
from rollgym.errors import DeadlineExceeded, InternalError, ProtocolError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.wire import PAUSE_ENDPOINT, POLICY_ENDPOINT, RESUME_ENDPOINT

log = logging.getLogger("rollgym.policy")

CALL_TIMEOUT = 30.0
"""Seconds a pause or resume may take on one server (a pause without ``abort`` waits there for
the model calls in flight to finish)."""


@dataclass(frozen=True, slots=True)
class PauseAnswer:
    """One model server's answer to a pause: the version it runs, the model calls it aborted
    (to re-issue after the resume) and the calls it holds."""

    url: str
    version: int | None
    aborted: int
    held: int


class PolicyControl:
    """Pause, resume and version for a set of rollgym model servers (their URLs)."""

    def __init__(
        self,
        model_urls: str | Sequence[str],
        *,
        version: int = 0,
        call_timeout: float = CALL_TIMEOUT,
        token: str | None = None,
    ) -> None:
        urls = (model_urls,) if isinstance(model_urls, str) else tuple(model_urls)
        if not urls:
            raise ValueError("PolicyControl needs at least one model server URL")
        if call_timeout <= 0:
            raise ValueError("call_timeout must be positive")
        self.urls = tuple(u.rstrip("/") for u in urls)
        self.call_timeout = call_timeout
        self._version = version
        self.paused = False
        # Connection errors are retried (nothing was sent); a pause or resume that reached a
        # server is not replayed: its answer is the outcome.
        policy = RetryPolicy(
            max_attempts=2, deadline=call_timeout, attempt_timeout=call_timeout,
            connect_timeout=min(5.0, call_timeout), retry_statuses=(),
        )  # fmt: skip
        self._targets = [Target(f"model[{i}]", (u,), policy) for i, u in enumerate(self.urls)]
        self._http: HttpClient | None = None
        self._token = token
        # One pause or resume at a time: two on separate connections could reach a server in
        # the other order (a resume before its pause leaves the server paused).
        self._order = asyncio.Lock()

    @property
    def version(self) -> int:
        """The live policy version (the last one resumed with)."""
        return self._version

    def _client(self) -> HttpClient:
        if self._http is None:
            self._http = HttpClient(limit=64)
        return self._http

    async def pause(self, *, abort: bool = False, timeout_s: float = 600.0) -> list[PauseAnswer]:
        """Hold new model calls on every server (``abort``: abort the ones in flight too; they
        are re-issued after the resume). Returns once every server holds; otherwise resumes
        the ones that did at the old version and raises the first server's typed error."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        body = {"abort": abort, "timeout_s": timeout_s}
        # Without abort a server answers once its calls in flight are done: up to timeout_s.
        wait = self.call_timeout if abort else timeout_s + self.call_timeout
        async with self._order:
            answers = await self._send(self._targets, PAUSE_ENDPOINT, body, wait)
            answers = [_expired(a) for a in answers]
            failed = [(t, a) for t, a in zip(self._targets, answers, strict=True) if _failed(a)]
            if failed:
                await self._release(clear_staleness=False)
                raise _first_error("pause", failed)
            self.paused = True
        return [
            PauseAnswer(t.urls[0], _int(a.get("version")), _int(a.get("aborted")) or 0,
                        _int(a.get("held")) or 0)
            for t, a in zip(self._targets, answers, strict=True)
            if isinstance(a, dict)
        ]  # fmt: skip

    async def resume(self, version: int, *, max_staleness: int | None = None) -> None:
        """Make ``version`` live on every server (with the staleness bound its calls are held
        to) and release the held calls. Raises the first refusing server's typed error."""
        if version < self._version:
            raise ValueError(f"policy versions never go back ({version} < {self._version})")
        if max_staleness is not None and max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        async with self._order:
            answers = await self._send(
                self._targets, RESUME_ENDPOINT, {"version": version, "max_staleness": max_staleness}
            )
            failed = [(t, a) for t, a in zip(self._targets, answers, strict=True) if _failed(a)]
            if len(failed) < len(self._targets):
                self._version = version  # some run it now: the stream must judge by it
            if failed:
                raise _first_error("resume", failed)
            self.paused = False

    async def release(self, *, clear_staleness: bool = False) -> None:
        """Unpause every server at the version it runs (``clear_staleness``: and lift its
        staleness bound). Best effort, bounded: a server that does not take it is logged."""
        async with self._order:
            await self._release(clear_staleness=clear_staleness)

    async def _release(self, *, clear_staleness: bool) -> None:
        # Each server's own version: resuming at ours could be below it (409, still paused).
        states = await self._send(self._targets, POLICY_ENDPOINT, {})
        calls = []
        for target, state in zip(self._targets, states, strict=True):
            version = _int(state.get("version")) if isinstance(state, dict) else None
            if version is None:
                log.error("model server %s: no policy state to release it by: %s",
                          target.urls[0], state)  # fmt: skip
                continue
            body: dict[str, Any] = {"version": version}
            if clear_staleness:
                body["max_staleness"] = None
            calls.append((target, body))
        answers = await asyncio.gather(
            *(self._send([t], RESUME_ENDPOINT, b) for t, b in calls), return_exceptions=True
        )
        for (target, _), answer in zip(calls, answers, strict=True):
            got = answer[0] if isinstance(answer, list) else answer
            if _failed(got):
                log.error("model server %s was not released: %s", target.urls[0], got)
        self.paused = False

    async def _send(
        self,
        targets: list[Target],
        endpoint: str,
        body: dict[str, Any],
        timeout: float | None = None,
    ) -> list[dict[str, Any] | BaseException]:
        http = self._client()
        limit = self.call_timeout if timeout is None else timeout
        if limit != self.call_timeout:  # the targets' policy bounds a call: widen it
            targets = [_within(t, limit) for t in targets]
        # Read at each call, not at construction: a control built where no token exists yet
        # (before the servers start) still finds the one they created.
        headers = authorization(self._token or control_token())
        calls = [http.call(t, endpoint, body, headers=headers, deadline=limit) for t in targets]
        # The client's own deadline bounds each call; this one bounds a stuck connection pool.
        bounded = [asyncio.wait_for(c, limit + 5.0) for c in calls]
        return list(await asyncio.gather(*bounded, return_exceptions=True))

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def _failed(answer: object) -> bool:
    if isinstance(answer, asyncio.CancelledError):
        raise answer
    return isinstance(answer, BaseException)


def _within(target: Target, seconds: float) -> Target:
    """``target`` with its attempts and deadline bounded by ``seconds`` instead."""
    policy = target.policy.model_copy(update={"deadline": seconds, "attempt_timeout": seconds})
    return Target(target.name, target.urls, policy)


def _expired(answer: dict[str, Any] | BaseException) -> dict[str, Any] | BaseException:
    """A pause answer whose pause no longer holds (it expired while the server waited for its
    calls in flight) is a failed pause, never a success."""
    if isinstance(answer, dict) and answer.get("paused") is not True:
        return ProtocolError(
            "pause: the server's pause had already ended when it answered (its calls in flight "
            f"outlasted timeout_s): {answer}"
        )
    return answer


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _first_error(what: str, failed: list[tuple[Target, Any]]) -> RollgymError:
    """The typed error of the first server that failed ``what`` (each one is logged): a
    ``DeadlineExceeded`` for a server that did not answer in time, a ``ConnectError`` for one
    that is gone, the server's own error otherwise."""
    errors: list[RollgymError] = []
    for target, exc in failed:
        url = target.urls[0]
        if isinstance(exc, RollgymError):
            err = exc
        elif isinstance(exc, TimeoutError):
            err = DeadlineExceeded(f"{what}: no answer within the deadline", server=url)
        else:
            err = InternalError(f"{what}: {type(exc).__name__}: {exc}", server=url)
        log.error("model server %s did not take the %s: %s: %s", url, what, err.type, err.message)
        errors.append(err)
    return errors[0]
