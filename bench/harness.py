"""What the benchmarks share: task files, configs, processes, CPU accounting, collectors.

Two pipelines do the same work per rollout on the echo environment (one tool call):

- rollgym: collector -> agent -> model (``scripted``, or ``openai_proxy`` in front of the instant
  upstream of ``bare.py``) -> echo tool -> verify, each server a process started by rollgym's
  ``Supervisor``, the collector being rollgym's ``Collector`` in this process;
- bare: the same hops between the bare aiohttp processes of ``bare.py``, driven by a bare
  aiohttp client in this process.

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

from rollgym.collect import Collector, prepare_run
from rollgym.config import Config, parse_config
from rollgym.http import HttpClient
from rollgym.launch import Supervisor

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
BARE = BENCH_DIR / "bare.py"
VARIANTS = ("scripted", "proxy", "proxy_tokens")
"""``proxy_tokens``: the proxy with ``return_token_ids`` (every call's token ids and logprobs on
its last output item); its bare baseline is the plain proxy pipeline, the same hops."""

ECHO_TOOL = {
    "type": "function",
    "name": "echo",
    "description": "Return the text unchanged.",
    "parameters": {
        "additionalProperties": False,
        "properties": {"text": {"title": "Text", "type": "string"}},
        "required": ["text"],
        "type": "object",
    },
    "strict": False,
}

# The counting passes load bench/counting.py in rollgym's server processes.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p
)


def raise_fd_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def write_tasks(path: Path, n: int) -> Path:
    """``n`` echo tasks in NeMo Gym's row format (tools declared in the row)."""
    with path.open("wb") as fh:
        for i in range(n):
            text = f"echo-{i}"
            row = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": text}],
                    "tools": [ECHO_TOOL],
                },
                "expected_answer": text,
            }
            fh.write(orjson.dumps(row) + b"\n")
    return path


def rollgym_config(
    variant: str, upstream: str | None, *, counting: bool = False, concurrency: int = 256
) -> Config:
    if variant == "scripted":
        model: dict[str, Any] = {"kind": "model", "impl": "scripted"}
    else:
        options: dict[str, Any] = {"base_url": f"{upstream}/v1"}
        if variant == "proxy_tokens":
            options["return_token_ids"] = True
        model = {"kind": "model", "impl": "openai_proxy", "options": options}
    servers: dict[str, dict[str, Any]] = {
        "model": model,
        "echo": {"kind": "resources", "impl": "echo"},
        "agent": {
            "kind": "agent",
            "impl": "tool_agent",
            "options": {"model": "model", "resources": "echo"},
        },
    }
    if counting:
        counted = {"scripted": "CountingScripted", "openai_proxy": "CountingProxy"}
        counted |= {"echo": "CountingEcho", "tool_agent": "CountingAgent"}
        for server in servers.values():
            server["impl"] = "counting:" + counted[server["impl"]]
    data = {"servers": servers, "collect": {"concurrency": concurrency, "agent": "agent"}}
    return parse_config(data, "<bench>")


# -- processes -----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


@dataclass
class BareProc:
    role: str
    proc: subprocess.Popen[bytes]
    url: str

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_bare(role: str, **peers: str) -> BareProc:
    args = [sys.executable, str(BARE), role]
    for key, url in peers.items():
        args += [f"--{key}", url]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().split()
    if len(line) != 2 or line[0] != "READY":
        proc.kill()
        raise RuntimeError(f"bare {role} did not start: {line}")
    return BareProc(role, proc, f"http://127.0.0.1:{line[1]}")


def stop_bare(procs: list[BareProc]) -> None:
    for p in procs:
        if p.proc.poll() is None:
            p.proc.terminate()
    for p in procs:
        try:
            p.proc.wait(10)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
        if p.proc.stdout is not None:
            p.proc.stdout.close()


async def get_json(url: str) -> Any:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(url) as resp,
    ):
        return orjson.loads(await resp.read())


async def stats_of(url: str) -> dict[str, Any]:
    data: dict[str, Any] = await get_json(url + "/_bench/stats")
    return data


def diff_counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    b, a = before["counts"], after["counts"]
    return {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)}


# -- pipelines -----------------------------------------------------------------------------


@dataclass
class Pipeline:
    """A running set of servers: name -> pid and URL, plus what is needed to stop it."""

    kind: str  # "rollgym" or "bare"
    variant: str
    pids: dict[str, int]
    urls: dict[str, str]
    config: Config | None = None
    supervisor: Supervisor | None = None
    bare: list[BareProc] = field(default_factory=list)
    client: HttpClient | aiohttp.ClientSession | None = None

    async def stop(self) -> None:
        if isinstance(self.client, (HttpClient, aiohttp.ClientSession)):
            await self.client.close()
        if self.supervisor is not None:
            await self.supervisor.stop()
        stop_bare(self.bare)


async def start_rollgym(
    variant: str, *, counting: bool = False, concurrency: int = 256, log_dir: Path | None = None
) -> Pipeline:
    bare: list[BareProc] = []
    upstream = None
    if variant in ("proxy", "proxy_tokens"):
        bare.append(start_bare("upstream"))
        upstream = bare[0].url
    config = rollgym_config(variant, upstream, counting=counting, concurrency=concurrency)
    supervisor = Supervisor(config, log_dir=log_dir)
    try:
        urls = await supervisor.start()
    except BaseException:
        stop_bare(bare)
        raise
    pids = {s.name: s.proc.pid for s in supervisor.servers if s.proc is not None}
    flat = {name: u[0] for name, u in urls.items()}
    for p in bare:
        pids[p.role], flat[p.role] = p.pid, p.url
    return Pipeline("rollgym", variant, pids, flat, config, supervisor, bare, HttpClient())


async def start_bare_pipeline(variant: str, agent_role: str = "agent") -> Pipeline:
    """The bare servers; ``agent_role="nemo_agent"`` makes NeMo Gym's 9 hops, not our 8."""
    procs: list[BareProc] = []
    try:
        resources = start_bare("resources")
        procs.append(resources)
        if variant in ("proxy", "proxy_tokens"):
            procs.append(start_bare("upstream"))
            model = start_bare("proxy", upstream=procs[-1].url)
        else:
            model = start_bare("model")
        procs.append(model)
        procs.append(start_bare(agent_role, model=model.url, resources=resources.url))
    except BaseException:
        stop_bare(procs)
        raise
    names = {"resources": "echo", "proxy": "model", "model": "model", "nemo_agent": "agent"}
    pids = {names.get(p.role, p.role): p.pid for p in procs}
    urls = {names.get(p.role, p.role): p.url for p in procs}
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))
    return Pipeline("bare", variant, pids, urls, bare=procs, client=session)


def rollgym_urls(pipe: Pipeline) -> dict[str, list[str]]:
    """The URLs of the config's servers (not the bare upstream), as the collector takes them."""
    assert pipe.config is not None
    return {name: [url] for name, url in pipe.urls.items() if name in pipe.config.servers}


async def start_pipeline(
    kind: str, variant: str, *, counting: bool = False, log_dir: Path | None = None
) -> Pipeline:
    """rollgym's servers (``counting``: with request counters) or the bare ones; server logs
    go to ``log_dir`` (rollgym's; the bare servers log nothing)."""
    if kind == "rollgym":
        return await start_rollgym(variant, counting=counting, log_dir=log_dir)
    return await start_bare_pipeline(variant)


@dataclass
class CollectResult:
    rollouts: int
    succeeded: int
    failed: int
    wall_s: float  # dispatch only (first dispatch to last record)
    durations: list[float] = field(default_factory=list)  # per rollout, seconds

    @property
    def rate(self) -> float:
        return self.rollouts / self.wall_s if self.wall_s > 0 else 0.0


async def collect_rollgym(
    pipe: Pipeline, tasks: Path, out_dir: Path, concurrency: int, *, durations: bool = False
) -> CollectResult:
    """rollgym's collector, as ``rollgym collect`` runs it (no progress bar)."""
    assert pipe.config is not None and isinstance(pipe.client, HttpClient)
    collect = pipe.config.collect.model_copy(update={"concurrency": concurrency})
    prepared = prepare_run(pipe.config, collect, tasks, out_dir, resume=False)
    collector = Collector(
        prepared, rollgym_urls(pipe), agent="agent", progress=False, client=pipe.client
    )
    outcome = await collector.execute()
    counts = outcome.metrics["counts"]
    times: list[float] = []
    if durations:
        with (out_dir / "rollouts.jsonl").open("rb") as fh:
            times = [orjson.loads(line)["duration_s"] for line in fh]
    return CollectResult(
        prepared.total,
        counts["succeeded"],
        counts["failed"],
        outcome.metrics["timing"]["wall_seconds"],
        times,
    )


def _load_rows(tasks: Path, out_dir: Path) -> list[dict[str, Any]]:
    """The task rows, stamped as rollgym stamps them (set-up, before the clock starts)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tasks.open("rb") as fh:
        return [
            orjson.loads(line) | {"task_index": i, "rollout_index": 0} for i, line in enumerate(fh)
        ]


async def collect_bare(
    pipe: Pipeline, tasks: Path, out_dir: Path, concurrency: int, *, durations: bool = False
) -> CollectResult:
    """A bare collector: ``concurrency`` workers posting rows to ``/run``, one line each out."""
    assert isinstance(pipe.client, aiohttp.ClientSession)
    session = pipe.client
    url = pipe.urls["agent"] + "/run"
    rows = _load_rows(tasks, out_dir)
    it = iter(rows)
    ok = failed = 0
    times: list[float] = []
    headers = {"content-type": "application/json"}

    async def worker(out: Any) -> None:
        nonlocal ok, failed
        for row in it:
            t0 = time.monotonic()
            try:
                async with session.post(url, data=orjson.dumps(row), headers=headers) as resp:
                    body = await resp.read()
                    good = resp.status == 200
            except aiohttp.ClientError:
                good, body = False, b""
            if good:
                record = orjson.loads(body)
                record["duration_s"] = time.monotonic() - t0
                out.write(orjson.dumps(record) + b"\n")
                out.flush()
                ok += 1
                if durations:
                    times.append(record["duration_s"])
            else:
                failed += 1

    with (out_dir / "rollouts.jsonl").open("wb") as out:
        started = time.monotonic()
        await asyncio.gather(*(worker(out) for _ in range(min(concurrency, len(rows)))))
        wall = time.monotonic() - started
    return CollectResult(len(rows), ok, failed, wall, times)


async def collect(
    pipe: Pipeline, tasks: Path, out_dir: Path, concurrency: int, *, durations: bool = False
) -> CollectResult:
    run = collect_rollgym if pipe.kind == "rollgym" else collect_bare
    return await run(pipe, tasks, out_dir, concurrency, durations=durations)


async def measured_collect(
    pipe: Pipeline, tasks: Path, out_dir: Path, concurrency: int
) -> tuple[CollectResult, dict[str, float]]:
    """Collect and return the CPU seconds each process spent meanwhile (``collector``: this
    process)."""
    pids = {"collector": os.getpid(), **pipe.pids}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    result = await collect(pipe, tasks, out_dir, concurrency)
    cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    return result, cpu


async def count_hops(
    variant: str, tasks: Path, out_dir: Path, kind: str = "rollgym"
) -> dict[str, Any]:
    """Requests per rollout by server and path, from a counting pass."""
    pipe = await start_pipeline(kind, variant, counting=True, log_dir=out_dir / "logs")
    try:
        before = {name: await stats_of(url) for name, url in pipe.urls.items()}
        result = await collect(pipe, tasks, out_dir, 32)
        after = {name: await stats_of(url) for name, url in pipe.urls.items()}
    finally:
        await pipe.stop()
    n = result.succeeded
    per_path = {
        f"{name} {path}": count / n
        for name in sorted(pipe.urls)
        for path, count in sorted(diff_counts(before[name], after[name]).items())
    }
    return {"rollouts": n, "per_rollout": per_path, "total": round(sum(per_path.values()), 3)}


def median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else float("nan")


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, int(q * len(s)))]


def save_json(name: str, data: Any) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / name
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    return path


@contextlib.contextmanager
def timer() -> Any:
    t: dict[str, float] = {"start": time.monotonic()}
    yield t
    t["seconds"] = time.monotonic() - t["start"]
