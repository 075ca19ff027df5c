"""A vLLM-shaped chat completions upstream, written field by field from vLLM's protocol.

A toy tokenizer (one token per character: the id is its code point) and a toy chat template
make every id checkable by hand. The "model" calls the first tool ``tool_turns`` times (its
argument: the last word of the user's message), then answers ``The answer is <tool output>``;
with ``reasoning`` it thinks first (``reasoning_content``, or ``reasoning`` on newer vLLM).

What it honours, as vLLM does:
- ``logprobs: true`` with an integer ``top_logprobs``: ``choices[0].logprobs.content``, one
  entry per generated token; with ``return_tokens_as_token_ids`` each token is "token_id:N";
  a null ``top_logprobs`` gives ``logprobs: null``;
- ``return_token_ids: true`` (only when ``new_vllm``): top-level ``prompt_token_ids`` and
  ``choices[0].token_ids``;
- ``stream: true``: ``chat.completion.chunk`` objects, ``prompt_token_ids`` on the first, each
  piece with its own tokens' logprobs and ids, usage last if asked;
- ``POST /tokenize`` at the root: ``{"tokens", "count", "max_model_len"}`` of the prompt.

Faults of a real vLLM, on demand:
- ``stream_tool_args``: the arguments its *streaming* tool parser sends for a call, where they
  differ from the whole answer's (vLLM's streaming parsers are not its whole-answer parsers);
- ``stuck``: a frozen server: chat requests are read and not answered, and neither are
  ``/health`` nor ``/ping``, until ``release`` is set (then all answer as usual);
  ``stuck_first``: the same, for its first so many chat requests only (the server is frozen
  while the latest request is one of them);
- ``engine_dead``: its engine died while its HTTP server stays up (vLLM's
  ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``): chat requests get no answer until ``release`` (then a
  503), ``GET /health`` and ``/ping`` (GET or POST) answer 503; ``POST /health`` answers 405, as
  vLLM's GET-only route does;
- ``hold_for_probes``: chat answers wait until the server has had that many health probes
  (``wait_for_probes`` waits for them too).

``drift`` re-renders earlier tool calls' arguments the way a chat template that parses and
re-serialises JSON does (``{"text": "v1"}`` where the model wrote ``{"text":"v1"}``): the next
prompt then no longer begins with what the model generated.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

GEN_PROMPT = "<assistant>"
END = "<end>"


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def logprob(token: int) -> float:
    return -((token % 7) + 1) / 10


class VllmDouble:
    def __init__(self, *, new_vllm: bool = True, reasoning: str | None = None) -> None:
        self.new_vllm = new_vllm
        self.reasoning = reasoning
        self.reasoning_key = "reasoning_content"
        self.tool_turns = 1
        self.drift = False
        self.ignore_logprobs = False
        self.requests: list[dict[str, Any]] = []
        self.tokenize_requests: list[dict[str, Any]] = []
        self.generated: list[list[int]] = []  # every completion's token ids, in order
        self.prompts: list[list[int]] = []
        self.stream_tool_args: str | None = None
        self.stuck = False
        self.stuck_first = 0
        self.engine_dead = False
        self.hold_for_probes = 0
        self.probes = 0  # /health and /ping requests, any method
        self.release = asyncio.Event()  # ends every wait of ``stuck`` and ``engine_dead``
        self._probed = asyncio.Condition()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                # vLLM's /health takes GET only; POST is routed here to be counted (and hang
                # with a frozen server) and then answered 405, as vLLM's router does.
                Route("/health", self._health, methods=["GET", "POST"]),
                Route("/ping", self._health, methods=["GET", "POST"]),
            ]
        )

    # -- the toy chat template ---------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]]) -> str:
        out = []
        for m in messages:
            if m["role"] == "assistant":
                body = self._assistant_body(
                    m.get("reasoning_content") or m.get("reasoning"),
                    m.get("content") or "",
                    [
                        (c["function"]["name"], self._rendered_args(c["function"]["arguments"]))
                        for c in m.get("tool_calls") or []
                    ],
                )
                out.append(f"{GEN_PROMPT}{body}{END}")
            else:
                out.append(f"<{m['role']}>{m['content']}{END}")
        return "".join(out) + GEN_PROMPT

    def _rendered_args(self, arguments: str) -> str:
        return json.dumps(json.loads(arguments)) if self.drift else arguments

    @staticmethod
    def _assistant_body(reasoning: str | None, content: str, calls: list[tuple[str, str]]) -> str:
        think = f"<think>{reasoning}</think>" if reasoning else ""
        return think + content + "".join(f"<call>{n} {a}</call>" for n, a in calls)

    # -- routes -------------------------------------------------------------------------------

    async def _tokenize(self, request: Request) -> Response:
        body = await request.json()
        self.tokenize_requests.append(body)
        tokens = ids(self.render(body["messages"]))
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})

    def _frozen(self) -> bool:
        return self.stuck or 0 < len(self.requests) <= self.stuck_first

    async def wait_for_probes(self, count: int) -> None:
        async with self._probed:
            await self._probed.wait_for(lambda: self.probes >= count)

    async def _health(self, request: Request) -> Response:
        async with self._probed:
            self.probes += 1
            self._probed.notify_all()
        if self._frozen():
            await self.release.wait()
        if request.method == "POST" and request.url.path == "/health":
            return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)
        return Response(status_code=503 if self.engine_dead else 200)

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        if self._frozen():
            await self.release.wait()
        if self.engine_dead:
            await self.release.wait()
            error = {"error": {"message": "EngineDeadError", "code": 503}}
            return JSONResponse(error, status_code=503)
        if self.hold_for_probes:
            await self.wait_for_probes(self.hold_for_probes)
        messages = body["messages"]
        prompt = ids(self.render(messages))
        self.prompts.append(prompt)
        tools = body.get("tools") or []
        done = sum(m["role"] == "tool" for m in messages)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        pieces: list[tuple[str, Any]] = []  # (delta kind, delta value) with its text
        texts: list[str] = []
        if self.reasoning:
            message[self.reasoning_key] = self.reasoning
            pieces.append((self.reasoning_key, self.reasoning))
            texts.append(f"<think>{self.reasoning}</think>")
        if tools and done < self.tool_turns:
            user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
            name = tools[0]["function"]["name"]
            args = json.dumps({"text": user.split()[-1]}, separators=(",", ":"))
            call = {"id": f"call_{len(self.requests)}", "type": "function",
                    "function": {"name": name, "arguments": args}}  # fmt: skip
            message["tool_calls"] = [call]
            pieces.append(("tool_call", call))
            texts.append(f"<call>{name} {args}</call>")
            finish = "tool_calls"
        else:
            last = messages[-1]["content"]
            message["content"] = f"The answer is {last}"
            pieces.append(("content", message["content"]))
            texts.append(message["content"])
            finish = "stop"
        texts.append(END)
        generated = ids("".join(texts))
        self.generated.append(generated)
        completion = self._completion(body, message, finish, prompt, generated)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return _sse(self._chunks(completion, pieces, texts, prompt, usage, body))
        return JSONResponse(completion)

    def _logprobs(self, body: dict[str, Any], tokens: list[int]) -> dict[str, Any] | None:
        if self.ignore_logprobs:
            return None
        if not body.get("logprobs") or not isinstance(body.get("top_logprobs"), int):
            return None  # vLLM: no logprobs for a null top_logprobs
        as_ids = body.get("return_tokens_as_token_ids")
        return {
            "content": [
                {
                    "token": f"token_id:{t}" if as_ids else chr(t),
                    "logprob": logprob(t),
                    "bytes": list(chr(t).encode()),
                    "top_logprobs": [],
                }
                for t in tokens
            ]
        }

    def _with_ids(self, body: dict[str, Any]) -> bool:
        return self.new_vllm and bool(body.get("return_token_ids"))

    def _completion(
        self,
        body: dict[str, Any],
        message: dict[str, Any],
        finish: str,
        prompt: list[int],
        generated: list[int],
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": self._logprobs(body, generated),
            "finish_reason": finish,
            "stop_reason": None,
        }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "toy"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(generated),
                "total_tokens": len(prompt) + len(generated),
            },
        }
        if self._with_ids(body):
            choice["token_ids"] = generated
            out["prompt_token_ids"] = prompt
        return out

    def _chunks(
        self,
        completion: dict[str, Any],
        pieces: list[tuple[str, Any]],
        texts: list[str],
        prompt: list[int],
        usage: bool,
        body: dict[str, Any],
    ) -> list[dict[str, Any]]:
        head = {k: completion[k] for k in ("id", "created", "model")}
        head["object"] = "chat.completion.chunk"
        with_ids = self._with_ids(body)

        def chunk(delta: dict[str, Any], text: str, **extra: Any) -> dict[str, Any]:
            tokens = ids(text)
            piece: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None,
                                     "logprobs": self._logprobs(body, tokens) if text else None}  # fmt: skip
            if with_ids:
                piece["token_ids"] = tokens
            return {**head, "choices": [{**piece, **extra}]}

        first = chunk({"role": "assistant", "content": ""}, "")
        if with_ids:
            first["prompt_token_ids"] = prompt
        out = [first]
        for (kind, value), text in zip(pieces, texts, strict=False):
            if kind == "tool_call":
                # Two chunks, as vLLM's tool parsers send them: the header, then the arguments.
                cut = text.index(" ") + 1
                fn = value["function"]
                header = {"index": 0, "id": value["id"], "type": "function",
                          "function": {"name": fn["name"], "arguments": ""}}  # fmt: skip
                out.append(chunk({"tool_calls": [header]}, text[:cut]))
                streamed = self.stream_tool_args
                rest = {"index": 0, "function": {"arguments": streamed or fn["arguments"]}}
                out.append(chunk({"tool_calls": [rest]}, text[cut:]))
            else:
                half = math.ceil(len(value) / 2)
                out.append(chunk({kind: value[:half]}, text[: len(text) - len(value) + half]))
                out.append(chunk({kind: value[half:]}, text[len(text) - len(value) + half :]))
        finish = completion["choices"][0]["finish_reason"]
        out.append(chunk({}, END, finish_reason=finish))
        if usage:
            out.append({**head, "choices": [], "usage": completion["usage"]})
        return out


def _sse(chunks: list[dict[str, Any]]) -> Response:
    data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return Response(data, media_type="text/event-stream")
