"""Hang benchmark: what a model upstream that never answers a few calls costs a run.

    .venv/bin/python bench/hang.py [--rollouts 500] [--hang-rate 0.005] [--seed 11] \
        [--upstream-stream]
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/hang.py   # the same against other code

An instant OpenAI-compatible upstream on 127.0.0.1 (chat completions, streamed when asked, as
vLLM does) that, for a seeded fraction of calls, accepts the request and never sends a byte.
In front of it, ``rollgym run`` with default settings: ``openai_proxy`` -> the echo
environment -> ``tool_agent`` (two model calls per rollout). Prints how long the run took, when
all but the hung rollouts were done, and how many rollouts succeeded, failed, or needed more
than one upstream call. The upstream stays alive (it answers its health probes, and has no
token counters), so with the proxy's default whole answers a lost call is caught by the hedge
(``rollgym.models.hedge``: sent again once it has run far longer than its peers; before it, a
lost call waited for its attempt timeout); ``--upstream-stream`` runs the proxy with
``upstream_stream: true``, whose idle timeout catches it. ``rollgym`` runs
as a child process, so ``PYTHONPATH`` picks the code
under test (e.g. the last commit, ``git archive HEAD | tar -x -C /tmp/before``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web


class HangingUpstream:
    """Chat completions that call the first tool, then say the tool's output; a seeded
    ``rate`` of calls hang (no headers, no bytes) until the client gives up."""

    def __init__(self, rate: float, seed: int) -> None:
        self.rate, self.rng = rate, random.Random(seed)
        self.calls = self.hung = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls += 1
        if self.rng.random() < self.rate:
            self.hung += 1
            await asyncio.sleep(3600)
        completion = self._completion(body)
        if not body.get("stream"):
            return web.json_response(completion)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for chunk in _chunks(completion):
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        tool_said = [m for m in messages if m["role"] == "tool"]
        if body.get("tools") and not tool_said:
            user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
            name = body["tools"][0]["function"]["name"]
            arguments = json.dumps({"text": str(user).split()[-1]})
            call = {"id": f"call_{self.calls}", "type": "function"}
            message["tool_calls"] = [{**call, "function": {"name": name, "arguments": arguments}}]
            finish = "tool_calls"
        else:
            message["content"] = str(tool_said[-1]["content"]) if tool_said else "nothing"
            finish = "stop"
        return {
            "id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 0,
            "model": "hang-bench", "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                             "total_tokens": 8},
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }  # fmt: skip


def _chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": 0,
            "model": completion["model"]}  # fmt: skip
    [choice] = completion["choices"]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
    return [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
        {**head, "choices": [], "usage": completion["usage"]},
    ]


def write_inputs(
    workdir: Path, upstream: str, rollouts: int, stream: bool = False
) -> tuple[Path, Path]:
    tasks = workdir / "tasks.jsonl"
    with tasks.open("w") as fh:
        for i in range(rollouts):
            row = {"responses_create_params": {"input": f"echo v{i}"}, "expected_answer": f"v{i}"}
            fh.write(json.dumps(row) + "\n")
    config = {
        "servers": {
            "model": {
                "kind": "model",
                "impl": "openai_proxy",
                "options": {
                    "base_url": upstream + "/v1",
                    **({"upstream_stream": True} if stream else {}),
                },
            },
            "env": {"kind": "resources", "impl": "echo"},
            "agent": {
                "kind": "agent",
                "impl": "tool_agent",
                "options": {"model": "model", "resources": "env", "tools_from_server": True},
            },
        },
        "collect": {"input": str(tasks)},  # everything else: the defaults
    }
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, tasks


async def watch(out: Path, start: float, total: int, marks: dict[str, float]) -> None:
    """Note when all but the hung rollouts are recorded (polled every 0.2 s)."""
    while True:
        done = 0
        for name in ("rollouts.jsonl", "failures.jsonl"):
            path = out / name
            if path.exists():
                done += path.read_bytes().count(b"\n")
        for fraction in (0.99, 1.0):
            key = f"{fraction:.0%}"
            if key not in marks and done >= fraction * total:
                marks[key] = time.monotonic() - start
        await asyncio.sleep(0.2)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=500)
    parser.add_argument("--hang-rate", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--upstream-stream", action="store_true", help="the proxy streams")
    args = parser.parse_args()

    upstream = HangingUpstream(args.hang_rate, args.seed)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.chat)
    runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    with tempfile.TemporaryDirectory(prefix="rollgym-hang-") as tmp:
        workdir = Path(tmp)
        url = f"http://127.0.0.1:{port}"
        config, _ = write_inputs(workdir, url, args.rollouts, args.upstream_stream)
        out = workdir / "out"
        code = "import sys; from rollgym.cli.main import main; sys.argv[0] = 'rollgym'; main()"
        start = time.monotonic()
        marks: dict[str, float] = {}
        watcher = asyncio.create_task(watch(out, start, args.rollouts, marks))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, "run", str(config), "--output", str(out),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=os.environ,
        )  # fmt: skip
        _, stderr = await proc.communicate()
        wall = time.monotonic() - start
        await asyncio.sleep(0.3)
        watcher.cancel()
        metrics = json.loads((out / "metrics.json").read_text())
        failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    await runner.cleanup()

    counts = metrics.get("counts", {})
    extra_calls = upstream.calls - 2 * args.rollouts
    print(f"rollgym from: {os.environ.get('PYTHONPATH') or 'this checkout (installed)'}")
    print(f"exit code {proc.returncode}; `rollgym run` took {wall:.1f} s (start-up included)")
    print(f"99% of rollouts recorded after {marks.get('99%', float('nan')):.1f} s; all after "
          f"{marks.get('100%', float('nan')):.1f} s")  # fmt: skip
    print(f"rollouts: {args.rollouts}, ok {counts.get('succeeded')}, failed {counts.get('failed')}"
          f" {sorted({f['error']['type'] for f in failures})}")  # fmt: skip
    print(f"upstream calls: {upstream.calls} ({upstream.hung} hung, {extra_calls} more than "
          f"2 per rollout: retried calls)")  # fmt: skip
    if proc.returncode not in (0, 1) and stderr:
        print(stderr.decode()[-2000:])


if __name__ == "__main__":
    asyncio.run(main())
