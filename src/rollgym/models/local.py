"""A CPU model backend for small models: for tests and debugging, not throughput.

It serves a local model directory (``transformers`` on torch's CPU build) through the model
server contract rollgym uses for vLLM, so the whole loop (agent, environment, collector,
trainer samples, weight sync) runs on a laptop or in CI with no vLLM::

    POST /v1/chat/completions   vLLM-shaped token data: top-level ``prompt_token_ids`` and
                                ``choices[0].token_ids`` (``return_token_ids``),
                                ``logprobs.content[*]`` with ``token: "token_id:N"``
                                (``return_tokens_as_token_ids``); hermes tool calls parsed into
                                ``message.tool_calls`` (finish_reason ``tool_calls``); streaming
                                sends the whole answer as events once it is done
    POST /v1/responses          the same through rollgym's translation, every answer carrying
                                its token fields (as ``openai_proxy`` with ``return_token_ids``)
    POST /tokenize              vLLM's shape (``messages`` or ``prompt``)
    GET  /v1/models, /health
    POST /rollgym/weights       ``{"path": DIR, "version": N}``: load a trainer's safetensors
                                (with the control token, like pause and resume)
    GET  /rollgym/weights       the policy version served and where its weights came from
    GET  /rollgym/policy, POST /rollgym/pause, /rollgym/resume   the policy gate of every
                                rollgym model server (``rollgym.server.model``)

Every completion carries ``rollgym_policy_version``: the version of the weights it was generated
with from its first token to its last. ``openai_proxy`` with ``return_token_ids: true`` in front
of it works unchanged (``base_url: http://127.0.0.1:PORT/v1``).

**Bounded.** One generation at a time on one worker thread (two CPU cores do not run two
models faster than one); at most ``max_queue`` requests wait behind it, and one more is answered
503 with ``Retry-After``. A request has ``request_timeout`` seconds, waiting included: past it,
504 (it stops at its next token). A caller that goes away stops its generation at the next
token. ``max_tokens`` past ``max_tokens_cap``, a prompt that leaves no room in the context,
and any field that would change the sampling but is not implemented are 4xx
(``rollgym.models.local_request``), never a 500 or a hang.

**Weights** (``rollgym.models.local_weights``): a push needs the control token
(``rollgym.control_token``: any local user can reach the port) and names a checkpoint under
``weights_root`` (default: the directory holding ``model_dir``); a path outside it and a missing
one get the same 400. A push is read and checked on another thread
while generation goes on, then swapped in on the worker thread, so between two generations,
never during one. Versions must increase: a push whose version is not above the one served is
refused 409 (a stale trainer process must not roll the policy back); the version and path
being served again is answered 200 (``unchanged``), so a retried push that landed is no error.

**Logprobs** are of ``log_softmax(logits / temperature)``, what TRL's GRPOTrainer compares them
with (``rollgym.models.local_engine``).
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollgym.errors import HTTPStatusError, InvalidRequest
from rollgym.models.local_engine import Generation, Job, LocalEngine
from rollgym.models.local_request import ChatRequest, Sampling, messages, parse_chat
from rollgym.models.local_tools import Parsed, parse_tool_calls
from rollgym.models.tokens import attach, call_tokens, token_request
from rollgym.models.translate import chat_to_response, responses_to_chat
from rollgym.server.endpoint import BodyLimit, Call, error_response, json_endpoint
from rollgym.server.model import (
    CHAT_ENDPOINT,
    MODELS_ENDPOINT,
    TOKENIZE_ENDPOINT,
    ModelServer,
    controlled,
    gated_chat,
    json_object,
    model_list,
    policy_routes,
)
from rollgym.server.policy import note_upstream
from rollgym.server.streaming import chat_stream
from rollgym.wire import POLICY_VERSION, WEIGHTS_ENDPOINT

__all__ = ["POLICY_VERSION", "WEIGHTS_ENDPOINT", "LocalModel"]

PING_ENDPOINT = "/ping"
LOGPROB_FLOOR = -9999.0
"""Where ``-inf`` logprobs are clamped (as vLLM does): JSON has no infinity."""
TOKENIZER_THREADS = 2

T = TypeVar("T")


class LocalModel(ModelServer):
    """A local model directory served on the CPU (see the module docstring)."""

    own_upstream = True

    class Options(ModelServer.Options):
        model_dir: str = Field(description="a directory from save_pretrained (model, tokenizer)")
        served_model_name: str | None = Field(
            default=None, description="the name /v1/models lists (default: the folder's name)"
        )
        max_tokens_cap: int = Field(default=512, ge=1, le=1 << 20)
        max_model_len: int | None = Field(
            default=None, ge=2, description="context length (default: the model's)"
        )
        max_queue: int = Field(default=4, ge=0, le=4096, description="requests that may wait")
        request_timeout: float = Field(default=120.0, gt=0, description="seconds per request")
        retry_after: int = Field(default=1, ge=1, description="the 503's Retry-After seconds")
        policy_version: int = Field(default=0, ge=0, description="the version served at start")
        threads: int | None = Field(
            default=1,
            ge=1,
            description="torch's CPU threads (process-wide; null: torch's default). One is "
            "fastest for a tiny model, and several times faster than two on a busy machine",
        )
        max_body_bytes: int = Field(default=4 << 20, ge=1024)
        weights_root: str | None = Field(
            default=None,
            description="weight pushes may load only checkpoints under this directory "
            "(default: the directory holding model_dir)",
        )

    options: Options

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        opts = self.options
        self.engine = LocalEngine(
            opts.model_dir,
            max_model_len=opts.max_model_len,
            policy_version=opts.policy_version,
            threads=opts.threads,
        )
        self.served_name = opts.served_model_name or Path(opts.model_dir).name
        # Resolved once: a pushed path is resolved too, links and all, before it is compared.
        root = opts.weights_root or os.path.dirname(os.path.abspath(opts.model_dir))
        self.weights_root = Path(os.path.realpath(root))
        # One worker: generations and weight swaps run in order, never two at once.
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rollgym-local-model")
        self._tokenizers = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="rollgym-tok")
        self._pending = 0
        self._jobs: set[Job] = set()
        self._push_lock = asyncio.Lock()
        self.policy.raise_version(opts.policy_version)

    async def shutdown(self) -> None:
        for job in self._jobs:
            job.abandoned.set()
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._tokenizers.shutdown(wait=False, cancel_futures=True)
        await super().shutdown()

    def routes(self) -> list[BaseRoute]:
        limit = BodyLimit(
            self.options.max_body_bytes, f"servers.{self.name}.options.max_body_bytes"
        )
        return [
            self.responses_route(limit),
            Route(
                CHAT_ENDPOINT,
                json_endpoint(gated_chat(self.policy, self._chat), limit),
                methods=["POST"],
            ),
            Route(MODELS_ENDPOINT, json_endpoint(self._models), methods=["GET"]),
            Route(TOKENIZE_ENDPOINT, json_endpoint(self._tokenize, limit), methods=["POST"]),
            Route(
                WEIGHTS_ENDPOINT,
                json_endpoint(controlled(self._push, WEIGHTS_ENDPOINT), limit),
                methods=["POST"],
            ),
            Route(WEIGHTS_ENDPOINT, json_endpoint(self._weights), methods=["GET"]),
            # vLLM's liveness path, which openai_proxy probes when a call is slow.
            Route(PING_ENDPOINT, json_endpoint(self._ping), methods=["GET", "POST"]),
            *policy_routes(self.policy),
        ]

    def features(self) -> list[str]:
        return ["chat_completions", "tokenize", "token_ids", "weights"]

    def health(self) -> dict[str, Any]:
        engine = self.engine
        seconds = engine.generation_seconds
        return {
            **super().health(),
            "model": self.served_name,
            POLICY_VERSION: engine.policy_version,
            "queue": {"pending": self._pending, "max_waiting": self.options.max_queue},
            "generated_tokens": engine.generated_tokens,
            "tokens_per_second": round(engine.generated_tokens / seconds, 2) if seconds else None,
        }

    # -- endpoints -----------------------------------------------------------------------------

    async def _models(self, body: Any, call: Call) -> Any:
        listed = model_list(self.served_name, owned_by="rollgym-local")
        listed["data"][0]["max_model_len"] = self.engine.max_model_len
        return listed

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any] | Response:
        chat = token_request(responses_to_chat(params, model=self.served_name))
        chat.pop("stream", None)
        completion = await self._complete(chat)
        if isinstance(completion, Response):
            return completion
        response = chat_to_response(completion, params, upstream=self.name, model=self.served_name)
        attach(response["output"], call_tokens(completion, upstream=self.name))
        response[POLICY_VERSION] = completion[POLICY_VERSION]
        return response  # streamed, if asked, by the base

    async def _chat(self, body: Any, call: Call) -> Any:
        params = json_object(body)
        completion = await self._complete(params)
        if isinstance(completion, Response) or not params.get("stream"):
            return completion
        return chat_stream(completion, params)

    async def _tokenize(self, body: Any, call: Call) -> Any:
        params = json_object(body)
        engine = self.engine
        if "messages" in params:
            tools = params.get("tools") or None
            if tools is not None and not isinstance(tools, list):
                raise InvalidRequest("'tools' must be a list", status=400)
            kwargs = params.get("chat_template_kwargs") or {}
            if not isinstance(kwargs, dict):
                raise InvalidRequest("chat_template_kwargs must be an object", status=400)
            generation_prompt = params.get("add_generation_prompt", True) is not False
            ids = await self._off_loop(
                engine.render_messages, messages(params["messages"]), tools, kwargs,
                generation_prompt,
            )  # fmt: skip
        elif isinstance(params.get("prompt"), str):
            special = params.get("add_special_tokens", True) is not False
            ids = await self._off_loop(
                lambda: engine.encode(params["prompt"], add_special_tokens=special)
            )
        else:
            raise InvalidRequest(
                "/tokenize needs a 'prompt' string or a 'messages' list", status=400
            )
        strs = [engine.token_text(i) for i in ids] if params.get("return_token_strs") else None
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids,
                "token_strs": strs}  # fmt: skip

    async def _push(self, body: Any, call: Call) -> Any:
        params = json_object(body)
        path, version = params.get("path"), params.get("version")
        if not isinstance(path, str) or not path:
            raise InvalidRequest("'path' must name a directory or .safetensors file", status=400)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidRequest("'version' must be a non-negative integer", status=400)
        async with self._push_lock:  # one push at a time: versions are compared in order
            served = self.engine.policy_version
            if version == served and path == self.engine.weights_path:
                # A retried push whose first attempt landed: already done, not stale.
                return {POLICY_VERSION: version, "previous_version": served, "path": path,
                        "unchanged": True}  # fmt: skip
            if version <= served:
                raise InvalidRequest(
                    f"stale weights: version {version} is not above the served version "
                    f"{served}; versions must increase",
                    status=409,
                )
            started = time.monotonic()
            loaded = await self._off_loop(self.engine.read_weights, path, self.weights_root)
            loop = asyncio.get_running_loop()
            # On the worker: after the generations queued before it, before those after.
            await loop.run_in_executor(
                self._worker, self.engine.swap_weights, loaded, path, version
            )
            self.policy.raise_version(version)  # the live version is at least the one served
        return {POLICY_VERSION: version, "previous_version": served, "path": path,
                "tensors": len(loaded), "seconds": round(time.monotonic() - started, 3)}  # fmt: skip

    async def _ping(self, body: Any, call: Call) -> Any:
        return {"status": "ok"}

    async def _weights(self, body: Any, call: Call) -> Any:
        return {POLICY_VERSION: self.engine.policy_version, "path": self.engine.weights_path}

    # -- one generation ------------------------------------------------------------------------

    async def _complete(self, params: dict[str, Any]) -> dict[str, Any] | Response:
        opts = self.options
        request = parse_chat(params, max_tokens_cap=opts.max_tokens_cap)
        deadline = time.monotonic() + opts.request_timeout
        # Counted before the prompt is rendered: the queue bound holds renders too (200 big
        # requests must not all wait on the tokenizer threads past max_queue).
        if self._pending > opts.max_queue:
            busy = HTTPStatusError(
                f"busy: one generation runs and {opts.max_queue} wait (max_queue); retry "
                f"after {opts.retry_after}s",
                status=503, server=self.name, retryable=True,
            )  # fmt: skip
            answer = error_response(self.name, busy)
            answer.headers["Retry-After"] = str(opts.retry_after)
            return answer
        self._pending += 1
        job: Job | None = None
        try:
            prompt = await self._off_loop(self.engine.render, request)
            sampling = self._fit(request, len(prompt))
            job = Job(prompt, sampling, request.top_logprobs, deadline)
            self._jobs.add(job)
            future = self._worker.submit(self.engine.generate, job)
            generation = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if job is not None:
                job.abandoned.set()  # the caller went away: stop at the next token
            raise
        finally:
            self._pending -= 1
            if job is not None:
                self._jobs.discard(job)
        # The version these weights were, for the call's record (``rollgym.server.versions``).
        note_upstream(0, generation.policy_version)
        # Off the loop: one decode per token and alternative adds up for long answers.
        completion: dict[str, Any] = await self._off_loop(self._completion, request, generation)
        return completion

    def _fit(self, request: ChatRequest, prompt_len: int) -> Sampling:
        """The sampling with ``max_tokens`` fitted to the context; 400 if it does not fit."""
        room = self.engine.max_model_len - prompt_len
        if room < 1:
            raise InvalidRequest(
                f"the prompt is {prompt_len} tokens; this server's context is "
                f"{self.engine.max_model_len} (max_model_len), with no room to generate",
                status=400,
            )
        s = request.sampling
        if request.max_tokens_given and s.max_tokens > room:
            raise InvalidRequest(
                f"max_tokens {s.max_tokens} + the prompt's {prompt_len} tokens is past this "
                f"server's context of {self.engine.max_model_len} (max_model_len)",
                status=400,
            )
        return Sampling(s.temperature, s.top_p, s.top_k, min(s.max_tokens, room), s.seed, s.stop)

    def _completion(self, request: ChatRequest, g: Generation) -> dict[str, Any]:
        parsed = parse_tool_calls(g.text) if request.parse_tools else Parsed(g.text, ())
        message: dict[str, Any] = {
            "role": "assistant",
            "content": parsed.content if parsed.calls else g.text,
            "tool_calls": [call.as_chat() for call in parsed.calls],
        }
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": {"content": self._logprobs(request, g)} if request.logprobs else None,
            "finish_reason": "tool_calls" if parsed.calls else g.finish_reason,
            "stop_reason": g.stop_reason,
        }
        completion: dict[str, Any] = {
            "id": f"chatcmpl-{os.urandom(12).hex()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(g.prompt_ids),
                "completion_tokens": len(g.token_ids),
                "total_tokens": len(g.prompt_ids) + len(g.token_ids),
            },
            POLICY_VERSION: g.policy_version,
        }
        if request.return_token_ids:
            completion["prompt_token_ids"] = g.prompt_ids
            choice["token_ids"] = g.token_ids
        return completion

    def _logprobs(self, request: ChatRequest, g: Generation) -> list[dict[str, Any]]:
        def entry(token: int, logprob: float) -> dict[str, Any]:
            text = self.engine.token_text(token)
            return {
                "token": f"token_id:{token}" if request.token_id_strings else text,
                "logprob": max(logprob, LOGPROB_FLOOR),
                "bytes": list(text.encode()),
            }

        return [
            {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
            for t, lp, top in zip(g.token_ids, g.logprobs, g.top, strict=True)
        ]

    async def _off_loop(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on a tokenizer thread: rendering must not block the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizers, fn, *args)
