"""Failure-line benchmark: the size of a plain run's ``failures.jsonl`` line.

    PYTHONPATH=src .venv/bin/python bench/failure_line.py [--rollouts 4] [--body 200]
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/failure_line.py   # against other code

A real ``rollgym run`` (a child process, so ``PYTHONPATH`` picks the code under test):
``openai_proxy`` -> the echo environment -> ``tool_agent``, whose upstream is a server on
127.0.0.1 answering every call with HTTP 500 and a ``--body``-byte body. Every rollout fails
there (model.upstream 500 -> model 502 -> agent 502). Prints the size of each line, and the
size the same record had in the shape written before issue 37 (the error's every field, empty
ones too, and NeMo Gym 0.7's sidecar fields on every line), rebuilt from the line here: a lower
bound, since a relay's bare error envelope (the ``body`` of each error that has an ``origin``)
is no longer written and cannot be rebuilt. The exact figure of the old code is the first
command's run with ``PYTHONPATH`` naming an old checkout (``git worktree add /tmp/old
2368c01``): 2,418 bytes there for the default 200-byte body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.echo_run import write_echo_run  # noqa: E402

_COMMON = ("message", "status", "body", "truncated", "url", "method", "server", "endpoint",
           "attempts", "retryable", "origin")  # fmt: skip


def _full(error: dict[str, Any]) -> dict[str, Any]:
    """An error record with every common field (the shape before issue 37: None ones too)."""
    from rollgym.errors import RollgymError

    err = RollgymError.from_dict(error)
    out: dict[str, Any] = {"type": error.get("type")}
    for name in _COMMON:
        out[name] = getattr(err, name) if name != "origin" else None
    out.update({k: v for k, v in error.items() if k not in out})
    origin = error.get("origin")
    out["origin"] = _full(origin) if isinstance(origin, dict) else None
    return out


def before_shape(line: dict[str, Any]) -> bytes:
    """``line`` as it was written before issue 37 (the whole error, the 0.7 sidecar fields),
    less the relays' envelopes, which the line no longer holds."""
    from rollgym.errors import RollgymError
    from rollgym.nemo_gym.failures import delivery, failure_kind, sidecar_fields

    err = RollgymError.from_dict(line["error"])
    old = {
        **{k: v for k, v in line.items() if k != "error"},
        "error": _full(line["error"]),
        "failure_kind": failure_kind(err),
        "delivery": delivery(err),
        "_ng_task_index": line["task_index"],
        "_ng_rollout_index": line["rollout_index"],
        **sidecar_fields(err),
    }
    return json.dumps(old, separators=(",", ":")).encode()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--body", type=int, default=200, help="bytes of the upstream's 500 body")
    args = parser.parse_args()
    body = (b'{"error":{"message":"' + b"x" * args.body)[: args.body - 3] + b'"}}'
    assert len(body) == args.body

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fail)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        with tempfile.TemporaryDirectory(prefix="rollgym-failure-line-") as tmp:
            workdir = Path(tmp)
            config = write_echo_run(workdir, f"http://127.0.0.1:{port}", args.rollouts, 2)
            out = workdir / "out"
            code = "import sys; from rollgym.cli.main import main; sys.argv[0] = 'rollgym'; main()"
            run = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, "run", str(config), "--output", str(out),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                env=os.environ,
            )  # fmt: skip
            await run.wait()
            lines = (out / "failures.jsonl").read_bytes().splitlines()
            if os.environ.get("SHOW_LINE"):
                print(lines[0].decode() if lines else "")
    finally:
        await runner.cleanup()
    print(f"rollgym from: {os.environ.get('PYTHONPATH') or 'this checkout (installed)'}")
    print(f"run exit code {run.returncode}; {len(lines)} failure lines; upstream 500 body "
          f"{args.body} bytes")  # fmt: skip
    for raw in lines[:1]:
        line = json.loads(raw)
        old = before_shape(line)
        print(f"line now: {len(raw)} bytes; the same record before issue 37: >= {len(old)} bytes "
              f"(now / before: {len(raw) / len(old):.2f})")  # fmt: skip
        chain, node = [], line["error"]
        while isinstance(node, dict):
            chain.append(f"{node.get('type')}@{node.get('server')}")
            node = node.get("origin")
        print(f"error chain: {' <- '.join(chain)}")
    if lines:
        print(f"largest line: {max(len(raw) for raw in lines)} bytes")


if __name__ == "__main__":
    asyncio.run(main())
