"""Small stand-ins for the other side of NeMo Gym 0.4.0's wire, written from its source.

- ``nemo_resources_app``: a resources server as NeMo Gym's ``SimpleResourcesServer`` serves one:
  ``/seed_session``, ``/verify``, ``/aggregate_metrics`` (body ``{"verify_responses": [...]}``,
  answer ``{"group_level_metrics", "agent_metrics", "key_metrics"}``), its session in a cookie,
  and no ``/tools`` (its tools are in the rows).
- ``fake_vllm_app``: vLLM's ``POST /tokenize`` at the root and ``POST /v1/chat/completions``.
- ``NEMO_AGGREGATE_KEYS``: the fields of NeMo Gym's ``AggregateMetrics``.

Every request is recorded as (path, headers, JSON body) so tests can check what was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

NEMO_AGGREGATE_KEYS = {"group_level_metrics", "agent_metrics", "key_metrics"}


@dataclass
class Recorded:
    calls: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.calls]

    def bodies(self, path: str) -> list[Any]:
        return [body for p, _, body in self.calls if p == path]


async def _record(request: Request, seen: Recorded) -> Any:
    raw = await request.body()
    body = orjson.loads(raw) if raw else None
    seen.calls.append((request.url.path, dict(request.headers), body))
    return body


def nemo_resources_app(seen: Recorded, *, expected_key: str = "expected_answer") -> Starlette:
    """Reward 1.0 when the last output text contains the row's ``expected_key``."""

    async def seed(request: Request) -> Response:
        await _record(request, seen)
        response = JSONResponse({})
        response.set_cookie("nemo_gym_session", "signed-session-id")
        return response

    async def verify(request: Request) -> Response:
        body = await _record(request, seen)
        texts = [
            part.get("text", "")
            for item in body["response"]["output"]
            if item.get("type") == "message"
            for part in item.get("content") or []
        ]
        reward = 1.0 if str(body.get(expected_key)) in "".join(texts) else 0.0
        return JSONResponse({**body, "reward": reward})

    async def aggregate(request: Request) -> Response:
        body = await _record(request, seen)
        rewards = [vr["reward"] for vr in body["verify_responses"]]
        return JSONResponse(
            {
                "group_level_metrics": [],
                "agent_metrics": {"mean/reward": sum(rewards) / len(rewards)},
                "key_metrics": {"mean/reward": sum(rewards) / len(rewards)},
            }
        )

    return Starlette(
        routes=[
            Route("/seed_session", seed, methods=["POST"]),
            Route("/verify", verify, methods=["POST"]),
            Route("/aggregate_metrics", aggregate, methods=["POST"]),
        ]
    )


TOKENS = {"count": 3, "max_model_len": 4096, "tokens": [11, 12, 13], "token_strs": None}


def fake_vllm_app(seen: Recorded, *, tokenize_status: int = 200) -> Starlette:
    """vLLM's tokenizer at ``/tokenize`` (answering ``TOKENS``) and a chat endpoint."""

    async def tokenize(request: Request) -> Response:
        await _record(request, seen)
        if tokenize_status != 200:
            return JSONResponse({"error": "bad tokenize request"}, status_code=tokenize_status)
        return JSONResponse(TOKENS)

    async def chat(request: Request) -> Response:
        body = await _record(request, seen)
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    return Starlette(
        routes=[
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )
