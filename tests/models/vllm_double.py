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
  ``/health``, ``/ping`` nor ``/metrics``, until ``release`` is set (then all answer as usual);
  ``stuck_first``: the same, for its first so many chat requests only (the server is frozen
  while the latest request is one of them);
- ``engine_dead``: its engine died while its HTTP server stays up (vLLM's
  ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``): chat requests get no answer until ``release`` (then a
  503), ``GET /health`` and ``/ping`` (GET or POST) answer 503; ``POST /health`` answers 405, as
  vLLM's GET-only route does;
- ``hold_for_probes``: chat answers wait until the server has had that many health probes
  (``wait_for_probes`` waits for them too);
- ``slow_probes``: ``/health`` and ``/ping`` answer only after ``release`` (an API server too
  busy to answer its health check in time) while generation goes on;
- ``engine_stalled``: its engine froze while its HTTP server answers: ``/ping`` answers 200,
  chat requests are taken (and counted running) but no token is generated until ``release``;
- ``engine_stopped``: its engine process stopped (``SIGSTOP``) while idle, as vLLM 0.32 shows
  it (``test_vllm_freeze_real``): ``/ping`` answers 200 and ``/metrics`` what the engine last
  reported (it reports its gauges itself, with its steps), so chat requests taken from then on
  never reach it: not counted running, no token, until ``release``;
- ``lose``: the chat requests of these numbers (from 1) are taken and never answered (until
  ``release``), while the server and its engine serve every other one: a call the upstream
  lost (not counted running: the engine never saw it);
- ``freeze_after``: after that many chat requests, the whole process stops itself with
  ``SIGSTOP`` (only in a process of its own: ``python tests/models/vllm_double.py``).

``GET /stats`` counts requests and probes; ``POST /control`` sets ``engine_stalled`` (or
``release``) from outside. ``GET /metrics`` answers vLLM's Prometheus counters (``vllm:generation_tokens_total``,
``vllm:prompt_tokens_total``, ``vllm:num_requests_running``, ``vllm:num_requests_waiting``), or
404 when ``metrics`` is off. ``engines = 2``: two data-parallel engines, each sample labelled
``engine="0"`` or ``"1"`` as vLLM labels them: engine 0 takes this double's requests, engine 1
serves other clients (one request running, its counter 10 tokens further at each scrape). ``generate_seconds`` spreads each answer's tokens over that many
seconds, the counter moving token by token: a slow but progressing generation.

Weight sync, as vLLM 0.32 has it with ``VLLM_SERVER_DEV_MODE=1`` (read from its
``entrypoints/rl/online/api_router.py`` and ``serve/dev/rpc/api_router.py``): ``POST
/pause?mode=wait|abort`` (new chat requests are held until ``POST /resume``; ``wait`` answers
once none runs), ``GET /is_paused``, ``POST /collective_rpc {"method": "reload_weights",
"kwargs": {"weights_path"}}``, ``POST /update_weight_version {"new_version"}``, ``GET
/weight_info`` and ``GET /v1/models`` (``root``: ``model_root``, the checkpoint it started on).
A reload of a path that is not an absolute checkpoint directory, or whose tensors do not match
the served one's (or any, with ``fail_reloads``), answers 500 as vLLM does, drops that
connection (the next request sent on it is cut) and leaves the engine broken: the next chat request answers 500 and kills the server (``died``: every later
request has its connection cut), unless a good reload came first; after a mismatched checkpoint (failed half-loaded) every
reload fails, as vLLM 0.32's do (``wedged``). ``drop_resumes``: that many
``/resume`` requests have their connection cut unanswered (vLLM stays paused).

``drift`` re-renders earlier tool calls' arguments the way a chat template that parses and
re-serialises JSON does (``{"text": "v1"}`` where the model wrote ``{"text":"v1"}``): the next
prompt then no longer begins with what the model generated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import sys
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


class _WeightSync:
    """The weight-sync routes of ``VllmDouble`` (the module docstring)."""

    def _dev_routes(self: Any) -> list[Route]:
        return [
            Route("/pause", self._pause, methods=["POST"]),
            Route("/resume", self._resume, methods=["POST"]),
            Route("/is_paused", self._is_paused, methods=["GET"]),
            Route("/collective_rpc", self._rpc, methods=["POST"]),
            Route("/update_weight_version", self._version, methods=["POST"]),
            Route("/weight_info", self._weight_info, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]

    async def _weights_gate(self: Any) -> Response | None:
        """A chat request: held while paused; one that meets a broken engine kills it."""
        while self.paused:
            await self.resumed.wait()
        if self.engine_broken:
            self.died = True
            error = {"message": "EngineCore encountered an issue. See stack trace (above) for "
                     "the root cause.", "type": "InternalServerError", "code": 500}  # fmt: skip
            return JSONResponse({"error": error}, status_code=500)
        return None

    async def _pause(self: Any, request: Request) -> Response:
        self.dev_calls.append("pause")
        self.paused = True
        self.resumed.clear()
        if request.query_params.get("mode", "abort") == "wait":
            # ``running`` is a plain counter of the chat handlers: polled, not awaited.
            while self.running:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        return JSONResponse({"status": "paused"})

    async def _resume(self: Any, request: Request) -> Response:
        self.dev_calls.append("resume")
        if self.drop_resumes:
            self.drop_resumes -= 1
            return _Cut()
        self.paused = False
        self.resumed.set()
        return JSONResponse({"status": "resumed"})

    async def _is_paused(self: Any, request: Request) -> Response:
        return JSONResponse({"is_paused": self.paused})

    async def _rpc(self: Any, request: Request) -> Response:
        body = await request.json()
        path = body["kwargs"]["weights_path"]
        self.dev_calls.append(f"reload {path}")
        problem = self._reload_problem(path)
        if problem is not None:
            self.engine_broken = True  # vLLM's layerwise reload was begun, never finished
            self.closing.add(request.scope.get("client"))  # and it drops this connection
            message = (f"Call to collective_rpc method failed: Worker failed with error "
                       f"'{problem}', please check the stack trace above for the root cause")  # fmt: skip
            error = {"message": message, "type": "InternalServerError", "code": 500}
            return JSONResponse({"error": error}, status_code=500)
        self.engine_broken = False
        self.served = path
        self.reloads.append(path)
        return JSONResponse({"results": [None]})

    def _reload_problem(self: Any, path: str) -> str | None:
        from pathlib import Path

        from rollgym.errors import BadCheckpoint
        from rollgym.integrations.checkpoint import check_matches, checkpoint_dir

        if self.fail_reloads:
            self.fail_reloads -= 1
            return "reload failed (fail_reloads)"
        if self.wedged:
            return ""  # vLLM's layerwise reload replays the bad tensor: an AssertionError
        if not Path(path).is_absolute() or not Path(path).is_dir():
            return (f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
                    f"'{path}'. Use `repo_type` argument if needed.")  # fmt: skip
        served = self.served or self.model_root
        try:
            checkpoint_dir(path)
            if Path(served).is_dir():
                check_matches(Path(path), Path(served))
        except BadCheckpoint as exc:
            # A mismatch fails half-loaded (a missing path fails before anything is loaded).
            self.wedged = "does not match" in exc.message
            return exc.message
        return None

    async def _version(self: Any, request: Request) -> Response:
        body = await request.json()
        self.dev_calls.append(f"version {body['new_version']}")
        self.weight_version = body["new_version"]
        return JSONResponse({"success": True, "new_version": self.weight_version})

    async def _weight_info(self: Any, request: Request) -> Response:
        return JSONResponse({"weight_version": self.weight_version})

    async def _models(self: Any, request: Request) -> Response:
        model = {"id": "toy", "object": "model", "owned_by": "vllm", "root": self.model_root}
        return JSONResponse({"object": "list", "data": [model]})


class _Cut(Response):
    """A response whose connection is cut after its head: the client gets no answer."""

    def __init__(self) -> None:
        super().__init__(b"")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"100")]})  # fmt: skip
        raise ConnectionAbortedError("the double cut this connection")


class _DiedMiddleware:
    """Once the double's engine killed it (``died``), every request has its connection cut;
    so has the next request on a connection in ``closing``."""

    def __init__(self, app: Any, double: Any) -> None:
        self.app = app
        self.double = double

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        closing = self.double.closing
        if scope["type"] == "http" and (self.double.died or scope.get("client") in closing):
            closing.discard(scope.get("client"))
            await _Cut()(scope, receive, send)
            return
        await self.app(scope, receive, send)


class VllmDouble(_WeightSync):
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
        self.slow_probes = False
        self.engines = 1
        self.other_tokens = 0  # engine 1's counter (``engines = 2``)
        self.engine_stalled = False
        self.engine_stopped = False
        self.lose: set[int] = set()
        self.freeze_after = 0
        self.metrics = True
        self.generate_seconds = 0.0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.running = 0
        self.scrapes = 0
        self.probes = 0  # /health and /ping requests, any method
        self.release = asyncio.Event()  # ends every wait of ``stuck`` and ``engine_dead``
        self._probed = asyncio.Condition()
        # Weight sync (the module docstring).
        self.model_root = "toy"
        self.served: str | None = None  # the checkpoint loaded last (None: model_root)
        self.weight_version = "default"
        self.paused = False
        self.resumed = asyncio.Event()
        self.engine_broken = False
        self.died = False
        self.fail_reloads = 0
        self.drop_resumes = 0
        self.wedged = False  # a reload failed half-loaded: every later reload fails too
        self.reloads: list[str] = []
        self.dev_calls: list[str] = []  # the weight-sync routes called, in order
        self.closing: set[Any] = set()  # connections (client address) to cut at their next use
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                # vLLM's /health takes GET only; POST is routed here to be counted (and hang
                # with a frozen server) and then answered 405, as vLLM's router does.
                Route("/health", self._health, methods=["GET", "POST"]),
                Route("/ping", self._health, methods=["GET", "POST"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/stats", self._stats, methods=["GET"]),
                Route("/control", self._control, methods=["POST"]),
                *self._dev_routes(),
            ]
        )
        self.app.add_middleware(_DiedMiddleware, double=self)

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
        if self._frozen() or self.slow_probes:
            await self.release.wait()
        if request.method == "POST" and request.url.path == "/health":
            return JSONResponse({"detail": "Method Not Allowed"}, status_code=405)
        return Response(status_code=503 if self.engine_dead else 200)

    async def _metrics(self, request: Request) -> Response:
        self.scrapes += 1
        if self._frozen():
            await self.release.wait()
        if not self.metrics:
            return Response("Not Found", status_code=404)
        engines = [("", self.generation_tokens, self.prompt_tokens, self.running)]
        if self.engines == 2:
            self.other_tokens += 10
            engines = [("0", *engines[0][1:]), ("1", self.other_tokens, 0, 1)]
        lines = []
        for name, kind in (("generation_tokens", "counter"), ("prompt_tokens", "counter"),
                           ("num_requests_running", "gauge"), ("num_requests_waiting", "gauge")):  # fmt: skip
            lines.append(f"# TYPE vllm:{name} {kind}")
            for engine, generation, prompt, running in engines:
                label = f'engine="{engine}",' if engine else ""
                label = f'{{{label}model_name="toy"}}'
                value = {"generation_tokens": generation, "prompt_tokens": prompt,
                         "num_requests_running": running}.get(name, 0)  # fmt: skip
                suffix = "_total" if kind == "counter" else ""
                lines.append(f"vllm:{name}{suffix}{label} {float(value)}")
                if kind == "counter":
                    lines.append(f"vllm:{name}_created{label} 1.7e+09")
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def _control(self, request: Request) -> Response:
        """Set faults from outside (a double in a process of its own): ``{"engine_stalled":
        true}``; ``{"release": true}`` ends every wait."""
        body = await request.json()
        if body.get("release"):
            self.release.set()
        if "engine_stalled" in body:
            self.engine_stalled = bool(body["engine_stalled"])
        return JSONResponse({"ok": True})

    async def _stats(self, request: Request) -> Response:
        return JSONResponse({"requests": len(self.requests), "probes": self.probes})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        if (gated := await self._weights_gate()) is not None:
            return gated
        self.requests.append(body)
        if self.freeze_after and len(self.requests) >= self.freeze_after:
            os.kill(os.getpid(), signal.SIGSTOP)  # the whole server freezes, as vLLM would
        if len(self.requests) in self.lose or self.engine_stopped:
            await self.release.wait()
        self.running += 1
        try:
            return await self._generate(request, body)
        finally:
            self.running -= 1

    async def _generate(self, request: Request, body: dict[str, Any]) -> Response:
        if self.engine_stalled:
            await self.release.wait()
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
        self.prompt_tokens += len(prompt)
        for _ in generated:  # the engine's counter, token by token
            if self.generate_seconds:
                await asyncio.sleep(self.generate_seconds / len(generated))
            self.generation_tokens += 1
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


def main() -> None:
    """Serve a double in a process of its own (a whole-process freeze needs one): prints its
    port on the first line of stdout, then serves until killed."""
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--freeze-after", type=int, default=0)
    parser.add_argument("--generate-seconds", type=float, default=0.0)
    args = parser.parse_args()
    double = VllmDouble()
    double.freeze_after = args.freeze_after
    double.generate_seconds = args.generate_seconds
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(double.app, log_level="error")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    sys.exit(main())
