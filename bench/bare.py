"""Bare aiohttp servers for the benchmarks: the baseline pipeline and the instant upstream.

Run as ``python bench/bare.py ROLE [--model URL] [--resources URL] [--upstream URL]``. The
process binds 127.0.0.1 on a free port, prints ``READY <port>`` on stdout and serves until
SIGTERM. Roles:

- ``upstream``: an instant OpenAI-compatible ``POST /v1/chat/completions``: a tool call for the
  first declared tool while the conversation has no tool message, else the last tool output as
  the final answer. Used behind rollgym's ``openai_proxy`` and behind the bare ``proxy``.
- ``agent``, ``model``, ``proxy``, ``resources``: the baseline. They make exactly the HTTP hops
  of a rollgym rollout (``/run``, ``/seed_session``, two ``/v1/responses``, the tool, ``/verify``;
  with ``proxy``, two upstream chat completions) with the same JSON bodies in both directions,
  and no framework logic: no validation, retries, breakers, balancing or error handling.
- ``nemo_agent``: ``agent`` making NeMo Gym's hops instead: its ``simple_agent`` posts the
  rollout to its own ``/v1/responses``, which runs the model and tool calls, so a rollout is
  9 requests with the proxy (``/run``, ``/seed_session``, the agent's ``/v1/responses``, two
  model ``/v1/responses``, two upstream completions, the tool, ``/verify``).
- ``instant_agent``: answers ``/run`` at once with a verify-shaped record (and
  ``/aggregate_metrics`` with ``{}``): a fast stand-in to measure the collector alone.
- ``collect`` (a client, not a server): the bare collector, ``--agent URL --input TASKS
  --output FILE --concurrency C``: streams the task file, posts each row to ``/run`` with at
  most C in flight and appends each answer to the output as it comes (the memory baseline).

Every role counts requests per path and the time spent in its handlers, served at
``GET /_bench/stats`` (not counted), so the benchmark can print requests per rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import web

JSON = "application/json"
SESSION_HEADER = "x-rollgym-session"
STATS_PATH = "/_bench/stats"


class Stats:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.handler_s = 0.0
        self.first_seen: dict[str, float] = {}

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "handler_s": self.handler_s,
            "first_seen": self.first_seen,
        }


STATS = Stats()


@web.middleware
async def count_requests(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path == STATS_PATH:
        return web.Response(body=orjson.dumps(STATS.as_dict()), content_type=JSON)
    STATS.counts[request.path] += 1
    STATS.first_seen.setdefault(request.path, time.time())
    t0 = time.perf_counter()
    try:
        return await handler(request)
    finally:
        STATS.handler_s += time.perf_counter() - t0


def reply(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type=JSON)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- the instant upstream ----------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.Response:
    params = orjson.loads(await request.read())
    messages = params.get("messages") or []
    tool_output = None
    user_text = ""
    for msg in messages:
        if msg.get("role") == "tool":
            tool_output = msg.get("content")
        elif msg.get("role") == "user":
            content = msg.get("content")
            user_text = content if isinstance(content, str) else ""
    tools = params.get("tools") or []
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if tool_output is None and tools:
        function = tools[0]["function"]
        props = (function.get("parameters") or {}).get("properties") or {}
        args = orjson.dumps({k: user_text for k in props}).decode()
        message["tool_calls"] = [
            {
                "id": new_id("call"),
                "type": "function",
                "function": {"name": function["name"], "arguments": args},
            }
        ]
        finish = "tool_calls"
    else:
        message["content"] = tool_output or "done"
        finish = "stop"
    answer: dict[str, Any] = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": params.get("model") or "instant",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    if params.get("return_token_ids") or params.get("logprobs"):
        # vLLM's shapes: "token_id:N" tokens with logprobs, prompt and generation ids. The
        # prompt ids grow with the conversation, so consecutive calls do not drift.
        prompt = [100 + len(str(m.get("content") or "")) % 50 for m in messages]
        generated = [7, 8, 9, 10, 11]
        answer["prompt_token_ids"] = prompt
        answer["choices"][0]["token_ids"] = generated
        answer["choices"][0]["logprobs"] = {
            "content": [
                {"token": f"token_id:{t}", "logprob": -0.5, "bytes": None, "top_logprobs": []}
                for t in generated
            ]
        }
    return reply(answer)


# -- the baseline pipeline ---------------------------------------------------------------------


def responses_object(params: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses API response with the fields rollgym's model servers send."""
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": params.get("model") or "bare",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools") or [],
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "max_output_tokens": params.get("max_output_tokens"),
        "metadata": params.get("metadata") or {},
        "instructions": params.get("instructions"),
        "error": None,
        "incomplete_details": None,
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    }


def message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": new_id("msg"),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call_item(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call_id or new_id("call"),
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


async def model_responses(request: web.Request) -> web.Response:
    """The scripted model's default behaviour: call the first tool, then say its output."""
    params = orjson.loads(await request.read())
    tool_output = None
    user_text = ""
    for item in params["input"]:
        kind = item.get("type", "message")
        if kind == "function_call_output":
            tool_output = item["output"]
        elif kind == "message" and item.get("role") == "user":
            user_text = item["content"]
    if tool_output is None:
        tool = params["tools"][0]
        props = tool["parameters"]["properties"]
        output = [call_item(tool["name"], orjson.dumps(dict.fromkeys(props, user_text)).decode())]
    else:
        output = [message_item(tool_output)]
    return reply(responses_object(params, output))


async def proxy_responses(request: web.Request) -> web.Response:
    """Responses -> chat completions at the upstream -> Responses, the least that works."""
    params = orjson.loads(await request.read())
    messages: list[dict[str, Any]] = []
    for item in params["input"]:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": item["content"]})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
    chat = {
        "messages": messages,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description"),
                    "parameters": t.get("parameters"),
                },
            }
            for t in params.get("tools") or []
        ],
    }
    session: aiohttp.ClientSession = request.app["session"]
    async with session.post(
        request.app["upstream"] + "/v1/chat/completions",
        data=orjson.dumps(chat),
        headers={"content-type": JSON},
    ) as resp:
        completion = orjson.loads(await resp.read())
    message = completion["choices"][0]["message"]
    output = []
    if message.get("content") is not None:
        output.append(message_item(message["content"]))
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        output.append(call_item(fn["name"], fn["arguments"], call["id"]))
    return reply(responses_object(params, output))


SESSIONS: dict[str, dict[str, Any]] = {}


async def seed_session(request: web.Request) -> web.Response:
    task = orjson.loads(await request.read())
    sid = uuid.uuid4().hex
    SESSIONS[sid] = task
    return reply({"session_id": sid})


async def echo_tool(request: web.Request) -> web.Response:
    args = orjson.loads(await request.read())
    SESSIONS.get(request.headers.get(SESSION_HEADER, ""))
    return reply({"echo": args["text"]})


async def verify(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    SESSIONS.pop(request.headers.get(SESSION_HEADER, ""), None)
    text = ""
    for item in reversed(body["response"]["output"]):
        if item.get("type") == "message":
            text = "".join(p.get("text", "") for p in item["content"])
            break
    expected = str(body.get("expected_answer", ""))
    return reply({**body, "reward": 1.0 if expected and expected in text else 0.0})


async def post(session: aiohttp.ClientSession, url: str, data: Any, headers: Any) -> Any:
    async with session.post(url, data=orjson.dumps(data), headers=headers) as resp:
        return orjson.loads(await resp.read())


async def run_rollout(request: web.Request) -> web.Response:
    """seed -> model -> tool -> model -> verify, as plain requests."""
    return await seeded_rollout(request, agent_loop)


async def nemo_run(request: web.Request) -> web.Response:
    """NeMo Gym's ``simple_agent``: seed, then the agent's OWN ``/v1/responses`` (one more hop,
    which runs the model and tool calls), then verify: 9 hops per rollout with the proxy."""
    return await seeded_rollout(request, own_responses)


async def seeded_rollout(request: web.Request, respond: Any) -> web.Response:
    """``/run``: seed the session, ``respond(app, params, headers, session headers)`` for the
    final response, verify it."""
    app = request.app
    session: aiohttp.ClientSession = app["session"]
    resources = app["resources"]
    row = orjson.loads(await request.read())
    key = f"{row.get('task_index')}:{row.get('rollout_index')}"
    headers = {"content-type": JSON, "x-rollgym-rollout": key}
    seeded = await post(session, resources + "/seed_session", row, headers)
    res_headers = {**headers, SESSION_HEADER: seeded["session_id"]}
    final = await respond(app, row["responses_create_params"], headers, res_headers)
    verified = await post(session, resources + "/verify", {**row, "response": final}, res_headers)
    return reply(verified)


async def own_responses(
    app: web.Application, params: dict[str, Any], headers: Any, res_headers: Any
) -> Any:
    """The rollout through the agent's own ``/v1/responses`` (``nemo_agent_responses``)."""
    return await post(app["session"], app["self"] + "/v1/responses", params, res_headers)


async def nemo_agent_responses(request: web.Request) -> web.Response:
    """The agent's own ``/v1/responses``: the tool-calling loop, answered as one response."""
    params = orjson.loads(await request.read())
    key = request.headers.get("x-rollgym-rollout", "")
    headers = {"content-type": JSON, "x-rollgym-rollout": key}
    res_headers = {**headers, SESSION_HEADER: request.headers.get(SESSION_HEADER, "")}
    return reply(await agent_loop(request.app, params, headers, res_headers))


async def agent_loop(
    app: web.Application, params: dict[str, Any], headers: Any, res_headers: Any
) -> dict[str, Any]:
    """Model and tool calls until the model stops calling tools; the final response."""
    session: aiohttp.ClientSession = app["session"]
    model, resources = app["model"], app["resources"]
    items = list(params["input"])
    outputs: list[Any] = []
    response: dict[str, Any] = {}
    for _ in range(10):
        response = await post(
            session, model + "/v1/responses", {**params, "input": items + outputs}, headers
        )
        outputs.extend(response["output"])
        calls = [o for o in response["output"] if o.get("type") == "function_call"]
        if not calls:
            break
        for call in calls:
            result = await post(
                session, f"{resources}/{call['name']}", orjson.loads(call["arguments"]), res_headers
            )
            outputs.append(
                {
                    "type": "function_call_output",
                    "id": new_id("fco"),
                    "call_id": call["call_id"],
                    "output": orjson.dumps(result).decode(),
                    "status": "completed",
                }
            )
    return {**response, "output": outputs}


CANNED_RESPONSE = responses_object(
    {"tools": []},
    [
        call_item("echo", '{"text": "hello"}'),
        {"type": "function_call_output", "call_id": "call_x", "output": '{"echo":"hello"}'},
        message_item('{"echo":"hello"}'),
    ],
)


async def instant_run(request: web.Request) -> web.Response:
    row = orjson.loads(await request.read())
    return reply({**row, "response": CANNED_RESPONSE, "reward": 1.0})


async def empty_object(request: web.Request) -> web.Response:
    await request.read()
    return reply({})


# -- the process -------------------------------------------------------------------------------


def build_app(args: argparse.Namespace, own_url: str) -> web.Application:
    app = web.Application(middlewares=[count_requests], client_max_size=64 * 1024 * 1024)
    add = app.router.add_post
    if args.role == "upstream":
        add("/v1/chat/completions", chat_completions)
    elif args.role == "model":
        add("/v1/responses", model_responses)
    elif args.role == "proxy":
        add("/v1/responses", proxy_responses)
        app["upstream"] = args.upstream.rstrip("/")
    elif args.role == "resources":
        add("/seed_session", seed_session)
        add("/echo", echo_tool)
        add("/verify", verify)
        add("/aggregate_metrics", empty_object)
    elif args.role == "agent":
        add("/run", run_rollout)
        app["model"], app["resources"] = args.model.rstrip("/"), args.resources.rstrip("/")
    elif args.role == "nemo_agent":
        add("/run", nemo_run)
        add("/v1/responses", nemo_agent_responses)
        app["model"], app["resources"] = args.model.rstrip("/"), args.resources.rstrip("/")
        app["self"] = own_url
    elif args.role == "instant_agent":
        add("/run", instant_run)
        add("/aggregate_metrics", empty_object)
    else:
        raise SystemExit(f"unknown role {args.role!r}")
    app.router.add_get(STATS_PATH, empty_object)  # answered by the middleware
    app.router.add_get("/health", empty_object)

    async def client_session(app: web.Application) -> Any:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        app["session"] = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        )
        yield
        await app["session"].close()

    app.cleanup_ctx.append(client_session)
    return app


async def serve(args: argparse.Namespace) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(4096)
    own_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    runner = web.AppRunner(build_app(args, own_url), access_log=None, keepalive_timeout=75)
    await runner.setup()
    await web.SockSite(runner, sock, backlog=4096).start()
    print(f"READY {sock.getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


async def collect(args: argparse.Namespace, tasks: Any, out: Any) -> tuple[float, float]:
    """Stream ``tasks`` to ``/run`` with ``args.concurrency`` workers, each answer to ``out``;
    return the seconds from the first request to the last answer and this process's CPU
    seconds meanwhile (``--timing FILE``)."""
    url = args.agent.rstrip("/") + "/run"
    headers = {"content-type": JSON}
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=600)
    rows = enumerate(tasks)

    async def worker(session: aiohttp.ClientSession) -> None:
        for i, line in rows:
            row = orjson.loads(line)
            row["task_index"], row["rollout_index"] = i, 0
            async with session.post(url, data=orjson.dumps(row), headers=headers) as resp:
                body = await resp.read()
            out.write(body + b"\n")
            out.flush()

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started, cpu_started = time.monotonic(), time.process_time()
        await asyncio.gather(*(worker(session) for _ in range(args.concurrency)))
        wall, cpu = time.monotonic() - started, time.process_time() - cpu_started
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="")
    parser.add_argument("--resources", default="")
    parser.add_argument("--upstream", default="")
    parser.add_argument("--agent", default="")
    parser.add_argument("--input", default="")
    parser.add_argument("--output", default="")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--timing", default="")
    args = parser.parse_args()
    if args.role == "collect":
        with open(args.input, "rb") as tasks, open(args.output, "wb") as out:
            wall, cpu = uvloop.run(collect(args, tasks, out))  # uvloop, as rollgym's collector
        if args.timing:
            Path(args.timing).write_bytes(orjson.dumps({"wall_s": wall, "cpu_s": cpu}))
    else:
        uvloop.run(serve(args))
    sys.exit(0)


if __name__ == "__main__":
    main()
