"""Fake OpenAI-compatible upstreams on 127.0.0.1 that bill by tokens, keeping their own count.

``BillingUpstream`` answers ``POST /v1/chat/completions`` (what ``openai_proxy`` calls) with a
short reply and a ``usage`` of its own counting: a prompt token per word of every message, a
completion token per word of the reply. Every ``fail_every``-th request is refused with 503 and
not billed (as a provider bills only what it answered), so the proxy's retries are exercised
without being billed twice; with ``fail_every`` above 1 (1: down for good), never the same
request twice (a retry of it is answered): the every-N counter is shared by concurrent requests, so under load one request's every retry
could land on it, and its rollout fail for a reason no test asked for. ``billed`` is the ground truth a cost ledger is checked against.
A judge upstream (``judge=True``) answers a verdict label, equal for even-numbered questions.

Failures can be injected per question (``question N`` in the last message): ``refuse(n)``
answers 503 unbilled; ``fail_billed(n)`` bills the call and then answers 500 (a provider that
fails after it has done the work), its error body saying the ``usage`` it billed when
``usage_on_error`` (else nothing of it). ``asked`` counts each question's billed calls, and
``failed_billed`` the billed calls that then failed (part of ``billed``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollgym.testing import serve_asgi


@dataclass
class Billed:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(part.get("text", "")) for part in value if isinstance(part, dict))
    return 0


@dataclass
class BillingUpstream:
    judge: bool = False
    fail_every: int = 0
    refuse: Callable[[int], bool] | None = None
    fail_billed: Callable[[int], bool] | None = None
    usage_on_error: bool = True
    requests: int = 0
    billed: Billed = field(default_factory=Billed)
    failed_billed: Billed = field(default_factory=Billed)
    asked: Counter[int] = field(default_factory=Counter)
    refused: set[bytes] = field(default_factory=set)

    async def completions(self, request: Request) -> Response:
        self.requests += 1
        raw = await request.body()
        due = self.fail_every and self.requests % self.fail_every == 0
        if due and (self.fail_every == 1 or raw not in self.refused):
            self.refused.add(raw)
            return Response(b'{"error": {"message": "overloaded"}}', 503)
        body = orjson.loads(raw)
        messages = body.get("messages") or []
        prompt = sum(_words(m.get("content")) for m in messages if isinstance(m, dict))
        last = str(messages[-1].get("content", "")) if messages else ""
        numbers = [int(n) for n in re.findall(r"question (\d+)", last)]
        question = numbers[0] if numbers else -1
        if self.refuse is not None and self.refuse(question):
            return Response(b'{"error": {"message": "down for this question"}}', 503)
        if self.judge:
            reply = "Checked. [[A=B]]" if numbers and numbers[0] % 2 == 0 else "No. [[A!=B]]"
        else:
            reply = f"My answer is {len(last.split())} of course"
        completion = len(reply.split())
        self.billed.calls += 1
        self.billed.input_tokens += prompt
        self.billed.output_tokens += completion
        self.asked[question] += 1
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}  # fmt: skip
        if self.fail_billed is not None and self.fail_billed(question):
            self.failed_billed.calls += 1
            self.failed_billed.input_tokens += prompt
            self.failed_billed.output_tokens += completion
            error: dict[str, Any] = {"error": {"message": "internal error after generation"}}
            if self.usage_on_error:
                error["usage"] = usage
            return Response(orjson.dumps(error), 500)
        answer = {
            "id": f"chatcmpl-{self.requests}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": reply},
                }
            ],
            "usage": usage,
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.completions, methods=["POST"])])


@asynccontextmanager
async def serve_billing(upstream: BillingUpstream) -> AsyncIterator[str]:
    """Serve ``upstream``; yield its base URL (without ``/v1``)."""
    async with serve_asgi(upstream.app()) as url:
        yield url
