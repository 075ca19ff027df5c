"""Sweep NeMo Gym 0.4.0's resources servers: which start offline, which run to the end under
rollgym's agents, and whether they pay the same reward as NeMo Gym's own agent for the same
model outputs. Prints a table (and writes it as JSON).

    .venv/bin/python -m interop.sweep [--only NAME ...] [--rows 3] [--json out/interop-sweep.json]

For each ``resources_servers/NAME``:
1. **imports**: its ``app.py`` imports in the interop venv (nemo-gym's own dependencies only;
   a server needing more is reported with the missing module, never installed from here).
2. **started offline**: ``gym env start`` (no network, ``skip_venv_if_present``) brings up the
   server from its own config, with NeMo Gym's agent (``simple_agent``, or ``gymnasium_agent``
   for ``/reset`` + ``/step`` servers) and ``openai_model`` in front of rollgym's scripted model.
   A config value left ``???`` (a judge endpoint, an API key) counts as not startable offline.
3. **ran to the end**: ``rollgym run`` with rollgym's ``tool_agent`` (``gymnasium_agent``) on
   the first ``--rows`` example rows records every rollout as a success.
4. **same reward**: NeMo Gym's agent ``/run`` on the same rows pays the same reward per row.
   Model outputs are deterministic: the example rollouts' own outputs replayed through the
   scripted model when the server ships ``example_rollouts.jsonl``, else the scripted model's
   default (call the first tool, then say its output).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from interop import nemo
from interop.nemo import free_port, openai_model, server_entry
from interop.rollgym_side import read_jsonl, rollgym_serve, write_config
from interop.rollouts import nemo_agent_rewards, rollgym_rewards, scripted

# Fields of a recorded rollout that are not the task: its verify answer, and NeMo Gym's indices
# (several rollouts of one task share a task index; each replay here is a task of its own).
NOT_TASK = {"response", "reward", "_ng_task_index", "_ng_rollout_index"}

IMPORT_CHECK = """
import importlib, json, pathlib, sys
import resources_servers
root = pathlib.Path(resources_servers.__path__[0])
out = {}
for name in sys.argv[1:]:
    # gym env start runs app.py with its own directory on the path (sibling modules by name).
    sys.path.insert(0, str(root / name))
    try:
        importlib.import_module(f"resources_servers.{name}.app")
        out[name] = None
    except BaseException as exc:  # a server's import may even sys.exit
        out[name] = f"{type(exc).__name__}: {exc}"[:200]
print(json.dumps(out))
"""


def import_errors(names: list[str]) -> dict[str, str | None]:
    done = subprocess.run(
        [str(nemo.INTEROP_VENV / "bin" / "python"), "-c", IMPORT_CHECK, *names],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return dict.fromkeys(names, f"import check crashed: {done.stderr[-300:]}")
    return json.loads(lines[-1])


def script_from_output(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A recorded response's model turns as a scripted-model script. Turns end where tool
    outputs come back; a turn with calls replays its calls (its text is dropped), else its
    messages' text."""
    turns: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if calls:
            turns.append({"calls": list(calls)})
        elif texts:
            turns.append({"say": "".join(texts)})
        calls.clear()
        texts.clear()

    for item in output:
        kind = item.get("type")
        if kind == "function_call":
            calls.append({"name": item["name"], "arguments": item.get("arguments") or "{}"})
        elif kind == "function_call_output":
            flush()
        elif kind == "message" and item.get("role", "assistant") == "assistant":
            texts.extend(
                p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)
            )
    flush()
    if not turns or "calls" in turns[-1]:
        turns.append({"say": ""})  # the scripted model repeats its last turn: end on words
    return turns


def task_rows(name: str, limit: int) -> tuple[list[dict[str, Any]], str]:
    data = nemo.site_packages() / "resources_servers" / name / "data"
    recorded = data / "example_rollouts.jsonl"
    if recorded.exists():
        rows = []
        for rollout in read_jsonl(recorded)[:limit]:
            row = {k: v for k, v in rollout.items() if k not in NOT_TASK}
            # A recorded request spells every unset field as null, which NeMo Gym refuses.
            params = row["responses_create_params"]
            row["responses_create_params"] = {k: v for k, v in params.items() if v is not None}
            rows.append(scripted(row, script_from_output(rollout["response"]["output"])))
        return rows, "replay"
    return read_jsonl(data / "example.jsonl")[:limit], "default"


def agent_kind(configs: dict[str, Any]) -> str:
    for entry in configs.values():
        agents = entry.get("responses_api_agents") if isinstance(entry, dict) else None
        if agents and "gymnasium_agent" in agents:
            return "gymnasium_agent"
    return "simple_agent"


def stack_config(name: str, model_url: str) -> tuple[dict[str, Any], str]:
    """NeMo Gym config for one resources server (its own entry, our ports) + agent + model."""
    configs = nemo.nemo_configs(name)
    entry = next(
        (
            e
            for e in configs.values()
            if isinstance(e, dict) and name in (e.get("resources_servers") or {})
        ),
        None,
    )
    if entry is None:
        raise LookupError("no config entry for the server")
    fields = dict(entry["resources_servers"][name])
    missing = [k for k, v in fields.items() if v == "???"]
    if missing:
        raise LookupError(f"config needs {', '.join(missing)} (???)")
    fields.pop("entrypoint", None)
    kind = agent_kind(configs)
    agent_fields: dict[str, Any] = {
        "resources_server": nemo.ref("resources_servers", name),
        "model_server": nemo.ref("responses_api_models", "policy_model"),
    }
    if kind == "gymnasium_agent":
        agent_fields["max_steps"] = 10
    config = {
        "policy_model": openai_model(free_port(), model_url + "/v1"),
        name: server_entry("resources_servers", name, free_port(), **fields),
        "agent": server_entry("responses_api_agents", kind, free_port(), **agent_fields),
    }
    return config, kind


def sweep_one(name: str, model_url: str, work: Path, limit: int) -> dict[str, Any]:
    result: dict[str, Any] = {"server": name}
    try:
        config, kind = stack_config(name, model_url)
        rows, source = task_rows(name, limit)
    except (LookupError, OSError, yaml.YAMLError, KeyError, ValueError) as exc:
        return {**result, "started": False, "note": str(exc)[:160]}
    result |= {"agent": kind, "outputs": source, "rows": len(rows)}
    shutil.rmtree(work / name, ignore_errors=True)  # rollgym run refuses a used output dir
    stack = nemo.GymStack(nemo.Workspace(work / name), config)
    started = time.monotonic()
    try:
        urls = stack.start(timeout=120)
    except RuntimeError as exc:
        last = [ln for ln in str(exc).splitlines() if "Error" in ln or "error" in ln]
        return {**result, "started": False, "note": (last[-1] if last else str(exc))[:160]}
    try:
        result["started"] = True
        result["start_s"] = round(time.monotonic() - started, 1)
        ours_kind = "gymnasium_agent" if kind == "gymnasium_agent" else "tool_agent"
        code, rollouts = rollgym_rewards(
            model_url, urls[name], rows, work / name / "rollgym", impl=ours_kind
        )
        ours = [r["reward"] if r else None for r in rollouts]
        try:
            theirs = nemo_agent_rewards(urls["agent"], rows)
        except Exception as exc:  # NeMo Gym's own agent broke (seen: a garbled HTTP answer)
            theirs = [(0, f"{type(exc).__name__}")] * len(rows)
            result["note"] = f"NeMo Gym's agent failed: {type(exc).__name__}: {exc}"[:160]
        result |= {
            "ran_to_end": code == 0 and None not in ours,
            "rollgym": ours,
            "nemo": [reward if status == 200 else f"HTTP {status}" for status, reward in theirs],
        }
        result["same_reward"] = result["rollgym"] == result["nemo"]
        if code != 0 and "note" not in result:
            failures = read_jsonl(work / name / "rollgym" / "run" / "failures.jsonl")
            result["note"] = (failures[0]["error"]["message"] if failures else f"exit {code}")[:160]
        return result
    finally:
        stack.stop()


def table(results: list[dict[str, Any]]) -> str:
    def mark(value: Any) -> str:
        return {True: "yes", False: "no", None: "-"}.get(value, str(value))

    lines = [
        "| server | started offline | ran to the end | same reward | agent | outputs | rewards (rollgym / NeMo Gym) | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rewards = f"{r.get('rollgym')} / {r.get('nemo')}" if "rollgym" in r else ""
        lines.append(
            f"| {r['server']} | {mark(r.get('started'))} | {mark(r.get('ran_to_end'))} | "
            f"{mark(r.get('same_reward'))} | {r.get('agent', '')} | {r.get('outputs', '')} | "
            f"{rewards} | {str(r.get('note', '')).replace('|', '/')} |"
        )
    started = [r for r in results if r.get("started")]
    lines.append(
        f"\n{len(results)} servers: {len(started)} started offline, "
        f"{sum(1 for r in started if r.get('ran_to_end'))} ran to the end, "
        f"{sum(1 for r in started if r.get('same_reward'))} same reward"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="resources servers to sweep (default: all)")
    parser.add_argument("--rows", type=int, default=3, help="example rows per server")
    parser.add_argument("--work", type=Path, default=Path("out/interop-sweep"))
    parser.add_argument("--json", type=Path, default=Path("out/interop-sweep.json"))
    args = parser.parse_args()

    servers_dir = nemo.site_packages() / "resources_servers"
    names = args.only or sorted(p.name for p in servers_dir.iterdir() if (p / "app.py").exists())
    errors = import_errors(names)
    results: list[dict[str, Any]] = []
    args.work.mkdir(parents=True, exist_ok=True)
    model_config = write_config(
        args.work / "model.yaml", {"servers": {"model": {"kind": "model", "impl": "scripted"}}}
    )
    with rollgym_serve(model_config) as urls:
        for name in names:
            if errors.get(name):
                results.append(
                    {"server": name, "started": False, "note": f"import: {errors[name]}"}
                )
            else:
                results.append(sweep_one(name, urls["model"][0], args.work.resolve(), args.rows))
            print(json.dumps(results[-1]), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
