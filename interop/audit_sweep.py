"""``rollgym audit`` over other catalogues' environments (issue 39, item 4): every NeMo Gym 0.7
resources server that starts offline, every reasoning-gym dataset rollgym offers, and the
OpenEnv environments the tests use. Prints a table; writes it as JSON and (``--markdown``) as
markdown, with the "N of M environments pay an answer that does not solve the task" line.

    .venv/bin/python -m interop.audit_sweep [--part nemo07 reasoning_gym openenv] [--only NAME ...]
        [--rows 8] [--timeout 15] [--json out/audit-sweep.json] [--markdown out/audit-sweep.md]

- **nemo07**: the servers ``interop/SWEEP07.md`` says start offline (``started offline: yes``),
  started by NeMo Gym 0.7's own ``gym env start`` (the venv ``INTEROP07_VENV``, by default
  ``.interop07-venv``; ``make interop07`` builds it), ``--batch`` servers per start (one Ray for
  several: a start costs tens of seconds), each with its offline config entry
  (``interop.sweep.server_fields``; a judge that is the policy model is rollgym's scripted model,
  which gives no verdict). A batch that does not start is started again one server at a time.
  Rows: ``--rows`` of the server's ``data/example.jsonl``, spread over the file.
- **reasoning_gym**: one ``reasoning_gym`` resources server (started as ``rollgym audit`` starts
  one), audited once per dataset of ``tasks.offered()`` on ``--rows`` rows made with seed 0.
- **openenv**: OpenEnv's example echo environment (``openenv init``'s, as ``tests/openenv``
  makes it) and ``examples/mixed``'s reverse environment, served by rollgym's ``impl: openenv``
  and played through their ``/ws`` session (``rollgym.openenv.audit``).

Each environment is audited as ``rollgym audit`` audits one (``audit_server``, the default
concurrency; ``--timeout`` seconds per call). An environment every play of which crashed (a
server that starts but fails offline, e.g. without its sandbox) is counted as not audited, as
is one that refused every play: "pays" is said only of environments that scored plays.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rollgym.audit.panel import CLASSES
from rollgym.audit.play import ServerAudit, audit_server
from rollgym.audit.run import sample
from rollgym.audit.target import Environment
from rollgym.config import parse_config
from rollgym.dialects import AUDIT_DIALECTS
from rollgym.http import HttpClient
from rollgym.launch.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("nemo07", "reasoning_gym", "openenv")


# -- one environment's line -------------------------------------------------------------------


def line(catalogue: str, name: str, audit: ServerAudit | None, note: str = "") -> dict[str, Any]:
    if audit is None:
        return {"catalogue": catalogue, "env": name, "verdict": "not audited", "note": note}
    scored = audit.plays - audit.refused - audit.skipped - _crashed(audit)
    verdict = audit.verdict
    if scored == 0:
        verdict = "not audited"
        note = note or (
            "every play crashed" if _crashed(audit) else "every play refused (not its protocol)"
        )
    return {
        "catalogue": catalogue,
        "env": name,
        "verdict": verdict,
        "classes": sorted({f.cls for f in audit.findings}),
        "findings": [
            {
                "class": f.cls, "probe": f.probe, "rows_paid": f.rows_paid,
                "rows_tried": f.rows_tried, "mean_reward": f.mean_reward,
                "mean_floor": f.mean_floor,
                "example": {"row": f.example.get("row"),
                            "answer": str(f.example.get("answer"))[:200],
                            "reward": f.example.get("reward"),
                            "error": str(f.example.get("error") or "")[:200]},
            }
            for f in audit.findings
        ],
        "plays": audit.plays,
        "refused": audit.refused,
        "skipped": audit.skipped,
        "seconds": audit.seconds,
        "note": note,
    }  # fmt: skip


def _crashed(audit: ServerAudit) -> int:
    crash = next((f for f in audit.findings if f.cls == "crash"), None)
    return int(crash.example.get("plays_crashed", 0)) if crash else 0


def read_rows(path: Path, limit: int) -> list[dict[str, Any]]:
    rows = []
    for text in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(text)
            if isinstance(row, dict) and isinstance(row.get("responses_create_params"), dict):
                rows.append(row)
    return sample(rows, limit)


async def audit_url(
    http: HttpClient, name: str, url: str, rows: list[dict[str, Any]], timeout: float
) -> ServerAudit:
    async with contextlib.AsyncExitStack() as stack:
        env: Any = None
        for dialect in AUDIT_DIALECTS:
            env = await stack.enter_async_context(dialect(name, url, timeout, 8))
            if env is not None:
                break
        env = env or Environment(http, name, url, timeout=timeout)
        return await audit_server(env, rows)


# -- NeMo Gym 0.7 -----------------------------------------------------------------------------


def offline_07() -> dict[str, str]:
    """The servers ``interop/SWEEP07.md`` lists as started offline, with their status there."""
    names = {}
    for text in (ROOT / "interop" / "SWEEP07.md").read_text().splitlines():
        cells = [c.strip() for c in text.strip().strip("|").split("|")]
        if len(cells) > 4 and cells[3] == "yes" and re.fullmatch(r"[\w-]+", cells[0]):
            names[cells[0]] = cells[1]
    return names


async def nemo07(args: argparse.Namespace, http: HttpClient, record: Any) -> None:
    from interop import nemo, sweep
    from interop.rollgym_side import rollgym_serve, write_config

    gym = nemo.NG07
    listed = offline_07()
    names = [n for n in listed if not args.only or n in args.only]
    work = Path(tempfile.mkdtemp(prefix="audit-sweep07-"))
    model_config = write_config(
        work / "model.yaml", {"servers": {"model": {"kind": "model", "impl": "scripted"}}}
    )
    with rollgym_serve(model_config) as model_urls:
        model_url = model_urls["model"][0]
        # A server that fails offline may end a start it shares: those start alone.
        alone = [[n] for n in names if listed[n] == "server fails offline"]
        shared = [n for n in names if listed[n] != "server fails offline"]
        batches = [shared[i : i + args.batch] for i in range(0, len(shared), args.batch)] + alone
        for batch in batches:
            started = await _start_07(batch, model_url, work, gym, nemo, sweep)
            if started is None and len(batch) > 1:
                for name in batch:
                    one = await _start_07([name], model_url, work, gym, nemo, sweep)
                    await _audit_07([name], one, args, http, record, gym)
                continue
            await _audit_07(batch, started, args, http, record, gym)


async def _start_07(
    batch: list[str], model_url: str, work: Path, gym: Any, nemo: Any, sweep: Any
) -> tuple[Any, dict[str, str]] | None:
    config: dict[str, Any] = dict(nemo.policy_model(model_url))
    for name in batch:
        fields = sweep.server_fields(name, gym)
        fields.pop("_variant", None)
        for own in ("entrypoint", "host", "port"):
            fields.pop(own, None)
        entry = nemo.server_entry("resources_servers", name, nemo.free_port(), **fields)
        config[name] = entry
    stack = nemo.GymStack(nemo.Workspace(work / "+".join(batch)[:80], gym), config)
    starting = asyncio.ensure_future(asyncio.to_thread(stack.start, 240))
    try:
        urls = await asyncio.shield(starting)
    except asyncio.CancelledError:  # Ctrl-C while it starts: what it started is stopped
        with contextlib.suppress(Exception):
            await starting
        await asyncio.to_thread(stack.stop)
        raise
    except Exception as exc:  # RuntimeError; seen too: BadStatusLine from a port Ray reused
        print(f"[audit-sweep] {batch} did not start: {str(exc).splitlines()[0]}", flush=True)
        return None
    return stack, urls


async def _audit_07(
    batch: list[str],
    started: tuple[Any, dict[str, str]] | None,
    args: argparse.Namespace,
    http: HttpClient,
    record: Any,
    gym: Any,
) -> None:
    if started is None:
        for name in batch:
            record(line("NeMo Gym 0.7", name, None, "did not start in this sweep"))
        return
    stack, urls = started
    try:
        for name in batch:
            data = gym.site_packages() / "resources_servers" / name / "data" / "example.jsonl"
            if not data.exists():
                record(line("NeMo Gym 0.7", name, None, "no data/example.jsonl"))
                continue
            rows = read_rows(data, args.rows)
            audit = await audit_url(http, name, urls[name], rows, args.timeout)
            record(line("NeMo Gym 0.7", name, audit))
    finally:
        await asyncio.to_thread(stack.stop)


# -- reasoning-gym ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(
    config: dict[str, Any], logs: Path, where: Path | None = None
) -> AsyncIterator[dict[str, list[str]]]:
    """The servers of ``config`` started as ``rollgym audit`` starts them; ``where``: the folder
    its ``impl:`` and ``app:`` modules are found in (the config's folder)."""
    source = str(where / "audit-sweep.yaml") if where else "<audit sweep>"
    supervisor = Supervisor(parse_config(config, source), log_dir=logs)
    try:
        yield await supervisor.start()
    finally:
        await supervisor.stop()


async def reasoning_gym(args: argparse.Namespace, http: HttpClient, record: Any) -> None:
    from rollgym.envs.reasoning_gym.tasks import DatasetChoice, make_rows, offered

    names = [n for n in offered() if not args.only or n in args.only]
    config = {"servers": {"rg": {"kind": "resources", "impl": "reasoning_gym"}}}
    with tempfile.TemporaryDirectory() as logs:
        async with serving(config, Path(logs)) as urls:
            for name in names:
                try:
                    rows = list(make_rows([DatasetChoice(name)], args.rows, seed=0))
                except Exception as exc:  # a dataset that cannot make rows here
                    record(line("reasoning-gym", name, None, f"no rows: {exc!r}"[:200]))
                    continue
                audit = await audit_url(http, name, urls["rg"][0], rows, args.timeout)
                record(line("reasoning-gym", name, audit))


# -- OpenEnv ----------------------------------------------------------------------------------

ECHO_ROWS = [
    {"responses_create_params": {"input": text}}
    for text in (
        "Send the echo environment a greeting.",
        "Say hello to the environment, then stop.",
        "Echo the word 'rollout' back.",
        "Send one message: the capital of France.",
    )
]


async def openenv(args: argparse.Namespace, http: HttpClient, record: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(root)],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        envs = {
            "echo_env (openenv init)": (
                {"app": "echo_env.server.app:app"}, root, ECHO_ROWS,
            ),
            "reverse (examples/mixed)": (
                {"app": "reverse_env:app"}, ROOT / "examples" / "mixed",
                [r for r in _jsonl(ROOT / "examples" / "mixed" / "tasks.jsonl")
                 if "openenv_reset" in r],
            ),
        }  # fmt: skip
        for name, (options, path, rows) in envs.items():
            if args.only and not any(o in name for o in args.only):
                continue
            config = {
                "servers": {"env": {"kind": "resources", "impl": "openenv", "options": options}}
            }
            async with serving(config, root / "logs", path) as urls:
                audit = await audit_url(http, name, urls["env"][0], rows[: args.rows],
                                        args.timeout)  # fmt: skip
            record(line("OpenEnv", name, audit))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


# -- the table --------------------------------------------------------------------------------


def summary(results: list[dict[str, Any]]) -> str:
    audited = [r for r in results if r["verdict"] != "not audited"]
    paying = [r for r in audited if r["verdict"] == "exploitable"]
    out = [
        f"{len(paying)} of {len(audited)} environments pay an answer that does not solve the "
        f"task ({len(results) - len(audited)} more could not be audited)."
    ]
    for catalogue in dict.fromkeys(r["catalogue"] for r in results):
        mine = [r for r in audited if r["catalogue"] == catalogue]
        pays = [r for r in mine if r["verdict"] == "exploitable"]
        out.append(f"- {catalogue}: {len(pays)} of {len(mine)}")
    counts: Counter[str] = Counter()
    for r in paying:
        counts.update(c for c in r["classes"] if c not in ("crash", "nondeterministic"))
    unreliable: Counter[str] = Counter()
    for r in audited:
        unreliable.update(c for c in r["classes"] if c in ("crash", "nondeterministic"))
    out.append("")
    out.append("| class | environments paid |")
    out.append("|---|---|")
    for cls in CLASSES:
        if cls in ("crash", "nondeterministic"):
            out.append(f"| `{cls}` (unreliable, not paid) | {unreliable[cls]} |")
        else:
            out.append(f"| `{cls}` | {counts[cls]} |")
    return "\n".join(out)


def table(results: list[dict[str, Any]]) -> str:
    out = [
        "| catalogue | environment | verdict | findings (probe: rows paid/tried, reward vs floor)"
        " | plays | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        found = "; ".join(
            f"`{f['class']}` {f['probe'][:50]}: {f['rows_paid']}/{f['rows_tried']}"
            + (f", {f['mean_reward']:g} vs {f['mean_floor']:g}"
               if f["mean_reward"] is not None and f["mean_floor"] is not None else "")
            for f in r.get("findings", [])[:4]
        )  # fmt: skip
        more = len(r.get("findings", [])) - 4
        found += f" (+{more} more)" if more > 0 else ""
        if r.get("note"):
            found = f"{found} ({r['note'][:120]})" if found else r["note"][:160]
        found = found.replace("|", "\\|").replace("\n", " ")
        out.append(
            f"| {r['catalogue']} | {r['env']} | {r['verdict']} | {found} | {r.get('plays', '-')} "
            f"| {r.get('seconds', '-')} |"
        )
    return "\n".join(out)


def timing(results: list[dict[str, Any]]) -> str:
    secs = sorted(r["seconds"] for r in results if isinstance(r.get("seconds"), (int, float)))
    if not secs:
        return ""
    over = [r["env"] for r in results if (r.get("seconds") or 0) > 60]
    return (
        f"Seconds per environment ({len(secs)} audited): median {secs[len(secs) // 2]:g}, "
        f"max {secs[-1]:g}; over 60 s: {', '.join(over) or 'none'}."
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--part", nargs="*", choices=PARTS, default=list(PARTS))
    parser.add_argument("--only", nargs="*", help="environments to audit (default: all)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    parser.add_argument("--batch", type=int, default=6, help="NeMo Gym servers per gym env start")
    parser.add_argument("--json", type=Path, default=Path("out/audit-sweep.json"))
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--merge", action="store_true", help="keep --json's other results")
    args = parser.parse_args()
    begun = time.monotonic()
    earlier = (
        json.loads(args.json.read_text())["results"] if args.merge and args.json.exists() else []
    )
    mine: list[dict[str, Any]] = []

    def record(result: dict[str, Any]) -> None:
        mine.append(result)
        print(json.dumps(result), flush=True)
        save(args, earlier, mine, begun)

    async with HttpClient() as http:
        for part in args.part:
            await {"nemo07": nemo07, "reasoning_gym": reasoning_gym, "openenv": openenv}[part](
                args, http, record
            )
    results = save(args, earlier, mine, begun)
    print(summary(results))
    print(timing(results))
    return 0


def save(
    args: argparse.Namespace, earlier: list[dict[str, Any]], mine: list[dict[str, Any]],
    begun: float,
) -> list[dict[str, Any]]:  # fmt: skip
    done = {(r["catalogue"], r["env"]) for r in mine}
    results = [r for r in earlier if (r["catalogue"], r["env"]) not in done] + mine
    order = {"NeMo Gym 0.7": 0, "reasoning-gym": 1, "OpenEnv": 2}
    results.sort(key=lambda r: (order.get(r["catalogue"], 9), r["env"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([".venv/bin/python -m interop.audit_sweep", *sys.argv[1:]])
    args.json.write_text(json.dumps(
        {"command": command, "wall_s": round(time.monotonic() - begun), "results": results},
        indent=1,
    ))  # fmt: skip
    if args.markdown:
        args.markdown.write_text(
            f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')}, "
            f"{round(time.monotonic() - begun)} s)\n\n"
            f"{summary(results)}\n\n{timing(results)}\n\n{table(results)}\n"
        )
    return results


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main()))
