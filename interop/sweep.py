"""Sweep NeMo Gym's resources servers (0.4.0's 95, or with ``--nemo 0.7`` 0.7.0's 145): which
start offline, which run to the end under rollgym's agents, and whether they pay the same
reward as NeMo Gym's own agent for the same model outputs. Prints a table, writes it as JSON
and (``--markdown``) as markdown.

    .venv/bin/python -m interop.sweep [--nemo 0.4|0.7] [--only NAME ...] [--rows 3]
        [--json out/interop-sweep.json] [--markdown interop/SWEEP.md] [--merge] [--table-only]

For each ``resources_servers/NAME``:
1. **imports**: its ``app.py`` imports in the interop venv (nemo-gym's own dependencies only;
   a server needing more is reported with the missing module, never installed from here).
2. **started offline**: ``gym env start`` (no network, ``skip_venv_if_present``) brings up the
   server from its own config, with NeMo Gym's agent (``simple_agent``, or ``gymnasium_agent``
   for ``/reset`` + ``/step`` servers) and ``openai_model`` in front of rollgym's scripted model.
   A config that needs a judge model or another server, or leaves a value unset, counts as not
   startable offline (``server_fields``); the log of a failed start names the cause.
3. **ran to the end**: ``rollgym run`` with rollgym's ``tool_agent`` (``gymnasium_agent``) on
   the first ``--rows`` task rows of the server's ``data/example.jsonl`` records every rollout
   as a success.
4. **same reward**: NeMo Gym's agent ``/run`` on the same rows pays the same reward per row.
   Model outputs are deterministic: the server's recorded rollouts (``example_rollouts.jsonl``)
   replayed through the scripted model (``task_rows``), else the scripted model's default.
   On 0.7 the agent is reached as 0.7's collector reaches it: through an explicit
   ``legacy_agent`` Environment Server (``environment``, on a port of ours), whose ``/run``
   relays the row; a row a verifier asks to mask (``mask_sample``) is named in the note.

``--merge`` re-sweeps the ``--only`` servers into an existing ``--json`` (the table lists every
run that made it); ``--table-only`` rewrites ``--markdown`` from ``--json``. The JSON is
rewritten after every server, so a sweep stopped part way keeps what it found (its run entry
says ``stopped``); ``--merge`` with the rest finishes it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from interop import nemo
from interop.nemo import NG04, NemoGym, free_port, server_entry
from interop.rollgym_side import TIMED_OUT, read_jsonl, rollgym_serve, write_config
from interop.rollouts import nemo_agent_answers, rollgym_rewards, scripted

# Fields of a recorded rollout that are not the task: its verify answer, and NeMo Gym's indices
# (several rollouts of one task share a task index; each replay here is a task of its own).
# 0.7's recordings add its verify answer's mask and failure fields, the collector's stamps and
# the agent's observations; task_source names the recording's own environment.
NOT_TASK = {
    "response",
    "reward",
    "_ng_task_index",
    "_ng_rollout_index",
    "mask_sample",
    "failure_kind",
    "failure_reason",
    "_ng_task_id",
    "_ng_environment_server",
    "_ng_result_type",
    "_ng_attempt_index",
    "_ng_rollout_id",
    "ng_trajectory",
    "ng_agent_observations",
    "ng_perf",
    "task_source",
}

IMPORT_CHECK = """
import importlib, json, pathlib, sys
import resources_servers
root = pathlib.Path(resources_servers.__path__[0])
out = {}
for name in sys.argv[1:]:
    # gym env start runs app.py with its own directory on the path (sibling modules by name);
    # a sibling module (util.py, ...) must not stay cached for the next server's import.
    folder = str(root / name)
    sys.path.insert(0, folder)
    before = set(sys.modules)
    try:
        importlib.import_module(f"resources_servers.{name}.app")
        out[name] = None
    except BaseException as exc:  # a server's import may even sys.exit
        out[name] = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        sys.path.remove(folder)
        for module in set(sys.modules) - before:
            where = getattr(sys.modules[module], "__file__", None) or ""
            if where.startswith(folder) and not module.startswith("resources_servers."):
                del sys.modules[module]
print(json.dumps(out))
"""


def import_errors(names: list[str], gym: NemoGym = NG04) -> dict[str, str | None]:
    done = subprocess.run(
        [str(gym.venv / "bin" / "python"), "-c", IMPORT_CHECK, *names],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return dict.fromkeys(names, f"import check crashed: {done.stderr[-300:]}")
    return json.loads(lines[-1])


def _flat(items: list[Any]) -> list[dict[str, Any]]:
    # aviary records its output as a list of per-step lists.
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, list):
            out.extend(_flat(item))
        elif isinstance(item, dict):
            out.append(item)
    return out


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

    for item in _flat(output):
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


def _content(content: Any) -> Any:
    # Text and every other part (an image's URL, a file): two tasks may share a question and
    # differ in their image. Recorded parts may gain fields (type, detail) set to defaults.
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            sorted((k, v) for k, v in p.items() if isinstance(v, str) and k not in SPELLING)
            for p in content
            if isinstance(p, dict)
        ]
        return parts[0][0][1] if len(parts) == 1 and len(parts[0]) == 1 else parts
    return ""


SPELLING = {"type", "detail", "id", "status"}


def prompt_key(row: dict[str, Any]) -> str:
    """A row's prompt, normalised: recorded rollouts respell messages (``type: message``,
    content as parts), so rows are matched on (role, text) of each input message."""
    given = (row.get("responses_create_params") or {}).get("input")
    if isinstance(given, str):
        return json.dumps([["user", given]])
    messages = [
        [m.get("role", ""), _content(m.get("content"))]
        for m in given or []
        if isinstance(m, dict) and m.get("type", "message") == "message"
    ]
    return json.dumps(messages)


def prompt_turns(row: dict[str, Any]) -> int:
    """Model turns already in the row's prompt (a conversation so far). The scripted model
    numbers its turns by counting them in its input (as ``rollgym.models.scripted`` does), so a
    replay starts after them."""
    given = (row.get("responses_create_params") or {}).get("input")
    turns, in_turn = 0, False
    for item in given if isinstance(given, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        by_model = kind in ("function_call", "reasoning") or (
            kind == "message" and item.get("role") == "assistant"
        )
        turns += by_model and not in_turn
        in_turn = by_model
    return turns


def replay(row: dict[str, Any], output: list[Any]) -> dict[str, Any]:
    """``row`` with a script replaying a recorded response's ``output``."""
    return scripted(row, [{"say": ""}] * prompt_turns(row) + script_from_output(output))


def _clean_params(params: dict[str, Any]) -> dict[str, Any]:
    # A recorded request spells every unset field as null, which NeMo Gym refuses.
    return {k: v for k, v in params.items() if v is not None}


def task_rows(
    name: str, limit: int, gym: NemoGym = NG04
) -> tuple[list[dict[str, Any]], str, list[Any]]:
    """The first ``limit`` tasks of the server's own ``data/example.jsonl`` (its task rows carry
    every field its ``/seed_session`` and ``/verify`` need; a recorded rollout lacks some and
    adds its verify answer's fields, which some servers refuse to receive again) and, for each,
    the model outputs to replay:

    - ``replay``: the outputs of the recorded rollout (``example_rollouts.jsonl``) of this very
      task (matched on its prompt);
    - ``replay-own``: no recorded rollout of this task, but the recorded rollout at this position
      carries every field of a task row: that rollout's own task and outputs;
    - ``replay-other``: the outputs recorded for another task of the same server (valid calls
      to its tools, most likely a wrong answer here);
    - ``default``: no recorded rollouts: the scripted model's default (call the first tool,
      then say its output).
    """
    data = gym.site_packages() / "resources_servers" / name / "data"
    # 0.7's task files carry some of the collector's stamps (and task_source): not task data.
    stamps = NOT_TASK - {"response", "reward"}
    examples = [
        {k: v for k, v in r.items() if k not in stamps} for r in read_jsonl(data / "example.jsonl")
    ]
    recorded_path = data / "example_rollouts.jsonl"
    try:
        recorded = read_jsonl(recorded_path)
    except ValueError:  # a Git LFS pointer or a broken file: no recorded outputs
        recorded = []
    # Some servers ship "rollouts" that are tasks without a response: nothing to replay.
    recorded = [r for r in recorded if isinstance(r.get("response"), dict)]
    if not examples and recorded:  # no task file: the recorded rollouts are the tasks
        examples = [{k: v for k, v in r.items() if k not in NOT_TASK} for r in recorded]
    if not examples:
        raise LookupError("no example rows (data/example.jsonl)")
    task_fields = {k for row in examples for k in row}
    by_prompt = {prompt_key(r): r for r in recorded}
    rows: list[dict[str, Any]] = []
    sources: list[str] = []
    recorded_rewards: list[Any] = []  # NeMo Gym's recorded reward for a replayed rollout
    for i, example in enumerate(examples[:limit]):
        match = by_prompt.get(prompt_key(example))
        if match is None and recorded:
            other = recorded[i % len(recorded)]
            own = {k: other[k] for k in task_fields if k in other}
            if set(example) <= set(own):
                own["responses_create_params"] = _clean_params(own["responses_create_params"])
                rows.append(replay(own, other["response"]["output"]))
                sources.append("replay-own")
                recorded_rewards.append(other.get("reward"))
                continue
            match, source = other, "replay-other"
        else:
            source = "replay" if match is not None else "default"
        sources.append(source)
        recorded_rewards.append(match.get("reward") if source == "replay" and match else None)
        if match is None:
            rows.append(example)
        else:
            rows.append(replay(example, match["response"]["output"]))
    return rows, ",".join(sorted(set(sources))), recorded_rewards


def own_agents(name: str, gym: NemoGym = NG04) -> list[str]:
    """The agents NeMo Gym's own configs put in front of this server (``simple_agent``, or
    e.g. ``claude_code_agent``, ``tau2``: some need an API or a sandbox)."""
    found = set()
    for entry in nemo.nemo_configs(name, gym).values():
        agents = entry.get("responses_api_agents") if isinstance(entry, dict) else None
        for agent, fields in (agents if isinstance(agents, dict) else {}).items():
            ref = fields.get("resources_server") if isinstance(fields, dict) else None
            if isinstance(ref, dict) and ref.get("type") == "resources_servers":
                found.add(agent)
    return sorted(found)


def agent_kind(configs: dict[str, Any]) -> str:
    for entry in configs.values():
        agents = entry.get("responses_api_agents") if isinstance(entry, dict) else None
        if agents and "gymnasium_agent" in agents:
            return "gymnasium_agent"
    return "simple_agent"


SERVER_KINDS = nemo.SERVER_KINDS


def references(value: Any) -> list[tuple[str, str]]:
    """Every ``{type: <server kind>, name}`` reference in a config entry's fields."""
    if isinstance(value, dict):
        if value.get("type") in SERVER_KINDS and isinstance(value.get("name"), str):
            return [(value["type"], value["name"])]
        return [ref for v in value.values() for ref in references(v)]
    if isinstance(value, list):
        return [ref for v in value for ref in references(v)]
    return []


# Top-level values some server configs interpolate (a judge or metrics endpoint that is the
# policy's own): set in every generated config, to rollgym's scripted model.
POLICY_VALUES = ("policy_base_url", "policy_api_key", "policy_model_name")
# An interpolation nothing here sets (an env variable with a default is set).
UNSET = re.compile(r"\$\{(?!oc\.env:[^,}]+,)(?!(?:" + "|".join(POLICY_VALUES) + r")\})")
JUDGE_FLAGS = ("should_use_judge", "use_judge", "enable_llm_judge")
POLICY = ("responses_api_models", "policy_model")


def server_fields(name: str, gym: NemoGym = NG04) -> dict[str, Any]:
    """The fields of the server's config entry that can run offline: its own config file
    (``configs/NAME.yaml``) first, then its other variants. An entry needing another server than
    the policy model (a judge model, a second resources server) or a value left ``???`` cannot;
    a judge reference with the judge switched off by the entry itself points at the policy model
    (never called). None can: ``LookupError`` with the first entry's reason."""
    folder = gym.site_packages() / "resources_servers" / name / "configs"
    files = sorted(folder.glob("*.yaml"), key=lambda f: (f.stem != name, f.name))
    reasons = []
    for path in files:
        for entry in (yaml.safe_load(path.read_text()) or {}).values():
            fields = (
                (entry.get("resources_servers") or {}).get(name)
                if isinstance(entry, dict)
                else None
            )
            if not isinstance(fields, dict):
                continue
            fields = dict(fields)
            missing = [k for k, v in fields.items() if v == "???"]
            missing += [  # an interpolation nothing here sets (an env variable with a default is)
                f"{k} = {v}" for k, v in fields.items() if isinstance(v, str) and UNSET.search(v)
            ]
            judge_off = any(fields.get(flag) is False for flag in JUDGE_FLAGS)
            needed = []
            for field, value in fields.items():
                refs = [r for r in references(value) if r != POLICY]
                if refs and judge_off and "judge" in field:
                    fields[field] = nemo.ref(*POLICY)
                elif refs:
                    needed.append((field, *refs[0]))
            if missing:
                reasons.append(f"not offline: its config needs {', '.join(missing)} (unset)")
            elif needed:
                field, kind, ref_name = needed[0]
                what = "a judge model" if kind == "responses_api_models" else "another server"
                reasons.append(f"not offline: {field} needs {what} ({kind}/{ref_name})")
            else:
                notes = [path.name] if path.stem != name else []
                if judge_off:
                    notes.append("judge off")
                elif any(
                    POLICY in references(v) or v == "${policy_base_url}"
                    for f, v in fields.items()
                    if "judge" in f
                ):
                    notes.append(
                        "its judge is the policy model: rollgym's scripted model here, which "
                        "answers a judge prompt with no verdict"
                    )
                if notes:
                    fields["_variant"] = ", ".join(notes)
                return fields
    raise LookupError(reasons[0] if reasons else "no config entry for the server")


def stack_config(
    name: str, model_url: str, gym: NemoGym = NG04
) -> tuple[dict[str, Any], str, str | None]:
    """NeMo Gym config for one resources server (its offline entry, our ports) + agent + model
    (+ on 0.7 the ``legacy_agent`` relay ``environment`` in front of the agent)."""
    configs = nemo.nemo_configs(name, gym)
    fields = server_fields(name, gym)
    variant = fields.pop("_variant", None)
    for own in ("entrypoint", "host", "port"):  # ours: the server listens where we chose
        fields.pop(own, None)
    kind = agent_kind(configs)
    agent_fields: dict[str, Any] = {
        "resources_server": nemo.ref("resources_servers", name),
        "model_server": nemo.ref("responses_api_models", "policy_model"),
    }
    if kind == "gymnasium_agent":
        agent_fields["max_steps"] = 10
    config = {
        **nemo.policy_model(model_url),
        name: server_entry("resources_servers", name, free_port(), **fields),
        "agent": server_entry("responses_api_agents", kind, free_port(), **agent_fields),
    }
    if gym.environment_servers:
        config["environment"] = nemo.legacy_agent(free_port(), "agent")
    return config, kind, variant


# Lines of a ``gym env start`` log that say nothing about why a server did not start.
NOISE = ("ulimit", "finished unexpectedly", "raise ", "Traceback")
ERROR_LINE = re.compile(r"^\s*([\w.]*(?:Error|Exception|Exit)\b.*)$")


def start_note(text: str, server_log: str = "") -> str:
    """Why ``gym env start`` failed, from its log: the server's own last error line (a
    missing module, a failed download, a config validation error) rather than NeMo Gym's
    "Process ... finished unexpectedly"; with no error line (a server that never answers),
    the last line of the server's own log."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if "CalledProcessError" in line and ("'clone'" in line or "git clone" in line):
            return _offline_reason(line.strip())
        found = ERROR_LINE.match(line)
        if not found or any(n in line for n in NOISE):
            continue
        note = found.group(1).strip()
        if "ValidationError" in note:  # the field and the complaint follow on the next lines
            note += ": " + " ".join(ln.strip() for ln in lines[i + 1 : i + 3])
        elif note.endswith("references"):  # NeMo Gym's own config check wraps its message
            note += " " + " ".join(ln.strip() for ln in lines[i + 1 : i + 3])
        elif note.startswith("Error: "):  # 0.7's console errors, wrapped at 80 columns
            rest = [ln.strip() for ln in lines[i + 1 : i + 8]]
            note += " " + " ".join(rest[: rest.index("")] if "" in rest else rest)
        return _offline_reason(note)
    own = [
        ln.split(") ", 1)[-1].strip()
        for ln in server_log.splitlines()
        if ln.strip() and not any(n in ln for n in (*NOISE, "INFO:", "uvicorn logging filter"))
    ]
    last = f"; its log ends: {own[-1]}" if own else ""
    timeout = re.search(r"nothing listens on \S+ after \d+ s", text)
    if timeout or "KeyboardInterrupt" in text:
        return f"never came up ({timeout.group(0) if timeout else 'start timed out'}){last}"
    return (lines[0] if lines else "no log") + last


def _offline_reason(note: str) -> str:
    if "CalledProcessError" in note and ("'clone'" in note or "git clone" in note):
        url = re.search(r"https?://[^'\s]+", note)
        return f"not offline: clones {url.group(0) if url else 'a repository'} ({note[:60]}...)"
    module = re.search(r"No module named '([\w.]+)'", note)
    if module:
        return f"not offline: needs package {module.group(1)!r} (not installed): {note}"
    if "Name or service not known" in note or "Temporary failure in name resolution" in note:
        return f"not offline: downloads at start: {note}"
    unset = re.search(r"for (\w+)Config: (\w+) Input should be .*input_value=None", note)
    if unset:
        return f"not offline: its config leaves {unset.group(2)} unset (an API key): {note}"
    if "model-server adapter is not compatible" in note:
        return f"not offline: it accepts only other model servers (vLLM): {note}"
    if "uv is required" in note:
        return f"not offline: builds its own venv with uv at start: {note}"
    return note


def innermost(error: dict[str, Any]) -> str:
    """A rollgym error record's root cause: the innermost origin's message and body."""
    while isinstance(error.get("origin"), dict):
        error = error["origin"]
    body = error.get("body")
    return f"{error.get('message', '')}: {body}" if body else str(error.get("message", ""))


# Ray gives its raylet 30 s to register (a constant in ray/_private/node.py): on a loaded
# machine a start fails there, before any server ran; such a start is tried again.
RAY_START_TIMEOUT = "The current node timed out during startup"
START_ATTEMPTS = 3


def sweep_one(name: str, model_url: str, work: Path, limit: int, gym: NemoGym) -> dict[str, Any]:
    result: dict[str, Any] = {"server": name, "imports": True}
    try:
        config, kind, variant = stack_config(name, model_url, gym)
        rows, source, recorded_rewards = task_rows(name, limit, gym)
    except (LookupError, OSError, yaml.YAMLError, KeyError, ValueError) as exc:
        return {**result, "started": False, "note": str(exc)[:300]}
    result |= {"agent": kind, "outputs": source, "rows": len(rows), "recorded": recorded_rewards}
    if variant:
        result["config"] = variant
    shutil.rmtree(work / name, ignore_errors=True)  # rollgym run refuses a used output dir
    started = time.monotonic()
    for attempt in range(1, START_ATTEMPTS + 1):
        stack = nemo.GymStack(nemo.Workspace(work / name, gym), config)
        try:
            urls = stack.start(timeout=180 if gym.environment_servers else 120)
            break
        except RuntimeError as exc:
            log = stack.log.read_text(errors="replace") if stack.log and stack.log.exists() else ""
            if RAY_START_TIMEOUT in log and attempt < START_ATTEMPTS:
                continue  # the machine was too busy for Ray's own start, not the server
            own = work / name / "logs" / f"{name}.log"
            own_log = own.read_text(errors="replace") if own.exists() else ""
            text = f"{str(exc).splitlines()[0]}\n{log}"
            return {**result, "started": False, "note": start_note(text, own_log)[:300]}
    if attempt > 1:
        result["start_attempts"] = attempt
    try:
        result["started"] = True
        result["start_s"] = round(time.monotonic() - started, 1)
        ours_kind = "gymnasium_agent" if kind == "gymnasium_agent" else "tool_agent"
        # One row at a time on both sides: some verifiers have time limits (math-verify's),
        # and rows verified side by side on 2 cores can run out of time on one side only.
        code, rollouts = rollgym_rewards(
            model_url, urls[name], rows, work / name / "rollgym", impl=ours_kind, concurrency=1
        )
        ours = [r["reward"] if r else None for r in rollouts]
        notes = []
        masked = [i for i, r in enumerate(rollouts) if r and r.get("mask_sample")]
        # 0.7's collector reaches the agent only through an Environment Server: its relay.
        front = urls["environment"] if gym.environment_servers else urls["agent"]
        try:
            theirs = nemo_agent_answers(front, rows, concurrency=1)
        except Exception as exc:  # NeMo Gym's own agent broke (seen: a garbled HTTP answer)
            theirs = [(0, f"{type(exc).__name__}")] * len(rows)
            notes.append(f"NeMo Gym's agent failed: {type(exc).__name__}: {exc}")
        result |= {
            "ran_to_end": code == 0 and None not in ours,
            "ran_rows": sum(r is not None for r in ours),
            "rollgym": ours,
            "nemo": [
                _answer(status, body).get("reward", f"HTTP {status}") for status, body in theirs
            ],
        }
        nemo_masked = [i for i, a in enumerate(theirs) if _answer(*a).get("mask_sample")]
        if masked or nemo_masked:
            result["masked"] = {"rollgym": masked, "nemo": nemo_masked}
            notes.append(f"mask_sample on rows: rollgym {masked}, NeMo Gym {nemo_masked}")
        result["same_reward"] = result["rollgym"] == result["nemo"]
        nemo_errors = [str(body) for status, body in theirs if status != 200]
        if code != 0:
            failures = read_jsonl(work / name / "rollgym" / "run" / "failures.jsonl")
            cause = innermost(failures[0]["error"]) if failures else f"exit {code}"
            if code == TIMED_OUT:
                cause = (
                    f"the run did not end within its time and was stopped; first failure: {cause}"
                )
            notes.append(f"rollgym: {cause}")
        if nemo_errors:
            notes.append(f"NeMo Gym's agent: {nemo_errors[0]}")
        if len(nemo_errors) == len(rows) and result["ran_rows"] == 0:
            # Both agents fail every row: the server's own log says why (it may have died).
            own = work / name / "logs" / f"{name}.log"
            errors = [
                m.group(1)
                for ln in (own.read_text(errors="replace") if own.exists() else "").splitlines()
                if (m := ERROR_LINE.match(ln.split(") ", 1)[-1]))
                and not any(n in ln for n in NOISE)
            ]
            if errors:
                notes.insert(0, _offline_reason(f"the server fails: {errors[-1]}"))
        if notes:
            result["note"] = " / ".join(n.replace("\n", " ")[:300] for n in notes)
        return complete(result, gym)
    finally:
        stack.stop()


def _answer(status: int, body: Any) -> dict[str, Any]:
    return body if status == 200 and isinstance(body, dict) else {}


def complete(r: dict[str, Any], gym: NemoGym) -> dict[str, Any]:
    """Fields derived from a result (also for results of an earlier sweep's JSON), from
    ``gym``'s own files: never another release's (0.4's configs pair servers differently)."""
    if not r.get("imports", True) and not str(r.get("note", "")).startswith("not offline"):
        r["note"] = _offline_reason(str(r.get("note", "")))
    if "rollgym" not in r:
        return r
    if "own_agents" not in r:
        try:
            r["own_agents"] = own_agents(r["server"], gym)
            variant = server_fields(r["server"], gym).get("_variant")
            if variant:
                r.setdefault("config", variant)
        except (LookupError, OSError, yaml.YAMLError, AttributeError, RuntimeError):
            r["own_agents"] = []  # RuntimeError: gym's venv is gone (a --table-only rewrite)
    r.setdefault("ran_rows", sum(x is not None for x in r["rollgym"]))
    if "recorded" not in r:
        try:
            r["recorded"] = task_rows(r["server"], r["rows"], gym)[2]
        except (LookupError, OSError, ValueError, RuntimeError):
            r["recorded"] = []
    if r["ran_rows"] == 0 and all(str(x).startswith("HTTP") for x in r["nemo"]):
        # Both agents fail every row on the server's own error: the server, not an agent.
        r["verdict"] = "server fails offline"
    return r


# What reading a server's source found, where the numbers alone would mislead.
KNOWN = {
    "blackjack": "deals from an unseeded random.Random(): a replay's reward is chance, equal "
    "rewards here are not guaranteed by a rerun",
    "competitive_coding_challenges": "not offline: loads ~27 GB of test metadata at start "
    "(test_file, CCC_TEST_FILE: data/test_metadata.jsonl, not shipped)",
    "equivalence_llm_judge": "its verify is the judge's verdict; the scripted model gives none, "
    "so every row pays 0 on both sides",
    "longmt_eval": "not offline: needs GPUs: its verify waits for 32 SegaleActors on extra_gpu "
    "Ray nodes (RuntimeError '0/32 SegaleActors ready after 300s'); both agents time out",
    "swerl_gen": "its verify runs the tests in a Singularity container ('No such file or "
    "directory: singularity'), so both pay 0",
    "speed_bench": "measures a vLLM server's speculative decoding from its /metrics",
    "math_with_judge": "row 1's math-verify check (a 4033rd power) takes ~5 s of SymPy on "
    "this machine, at math-verify's own 5 s limit: it pays 1 or 0 by load, on either side",
    "math_formal_lean": "its verify compiles the proof in a Lean 4 sandbox service (none here: "
    "'All connection attempts failed', proof_status error), so both pay 0",
    "example_mcp_weather": "its tool is served over MCP only (/mcp; claude_code_agent needs the "
    "Anthropic API) and its rows declare no tools: NeMo Gym's simple_agent gets "
    "404 from POST /get_weather, rollgym's tool_agent refuses the undeclared tool; no call is "
    "recorded, so both pay 0 (recorded: 1.0 under Claude Code)",
}

# The same, for 0.7's servers (filled from what the 0.7 sweep showed and their source says).
KNOWN07: dict[str, str] = {
    "example_mcp_weather": "its rows declare no tools; its verify pays a get_weather call seen "
    "in the session: NeMo Gym's simple_agent sends the model's call to POST /get_weather and "
    "pays 1, rollgym's tool_agent runs declared tools only and pays 0, warning about the "
    "undeclared get_weather (rollgym_undeclared_tools in each record)",
}


def status(r: dict[str, Any]) -> str:
    """One word for a server's outcome (the table's first verdict column)."""
    if not r.get("imports", True):
        return "import fails"
    if not r.get("started"):
        return "not offline" if str(r.get("note", "")).startswith("not offline") else "no start"
    if r.get("same_reward"):
        return "same reward"
    if r.get("verdict"):
        return str(r["verdict"])
    return "DIFFERENT" if r.get("ran_to_end") else "rollgym failed"


def _cell(value: Any) -> str:
    return str(value).replace("|", "/").replace("\n", " ")


def table(
    results: list[dict[str, Any]],
    runs: list[dict[str, Any]] | None = None,
    *,
    known: dict[str, str] | None = None,
) -> str:
    """The sweep's table as markdown (with how it was made, when ``runs`` are given); ``known``:
    what reading a server's source found (``KNOWN`` for 0.4, ``KNOWN07``)."""
    known = KNOWN if known is None else known

    def mark(value: Any) -> str:
        return {True: "yes", False: "no", None: "-"}.get(value, str(value))

    lines = []
    for run in runs or []:
        lines.append(
            f"- {run['date']}: `{run['command']}`: {len(run['servers'])} servers, "
            f"wall time {run['wall_s'] / 60:.1f} min"
            + (" (stopped part way: the servers it reached)" if run.get("stopped") else "")
        )
    if lines:
        lines.append("")
    lines += [
        "| server | status | imports | started offline | rollgym ran to the end | same reward as"
        " NeMo Gym's agent | outputs | rewards: rollgym / NeMo Gym (recorded) | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ran = (
            f"{mark(r.get('ran_to_end'))} ({r.get('ran_rows', 0)}/{r['rows']})"
            if ("rollgym" in r)
            else "-"
        )
        rewards = f"{r.get('rollgym')} / {r.get('nemo')}" if "rollgym" in r else ""
        mine = r.get("own_agents") or []
        agents = (
            f"NeMo Gym's configs pair it with {', '.join(mine)}, not {r['agent']}"
            if mine and r.get("agent") not in mine
            else None
        )
        off = [
            i
            for i, (rec, ours, theirs) in enumerate(
                zip(
                    r.get("recorded") or [],
                    r.get("rollgym") or [],
                    r.get("nemo") or [],
                    strict=False,
                )
            )
            if rec is not None and ours == theirs and ours != rec
        ]
        unlike = f"both differ from NeMo Gym's recorded reward on rows {off}" if off else None
        note = "; ".join(
            str(x)
            for x in (r.get("config"), agents, known.get(r["server"]), unlike, r.get("note"))
            if x
        )
        if rewards and any(x is not None for x in r.get("recorded") or []):
            rewards += f" ({r['recorded']})"
        lines.append(
            f"| {r['server']} | {status(r)} | {mark(r.get('imports', True))} | "
            f"{mark(r.get('started'))} | "
            f"{ran} | {mark(r.get('same_reward')) if 'rollgym' in r else '-'} | "
            f"{r.get('outputs', '')} | {rewards} | {_cell(note)[:400]} |"
        )
    lines.append("")
    lines.append(summary(results))
    return "\n".join(lines)


def summary(results: list[dict[str, Any]]) -> str:
    started = [r for r in results if r.get("started")]
    fails = [r["server"] for r in started if r.get("verdict") == "server fails offline"]
    same = [r for r in started if r.get("same_reward")]
    # Agreement on all-0 rewards is weak evidence (a judge that is the scripted model, a
    # missing sandbox service): counted apart, so "same reward" is not read as more.
    zero = [r["server"] for r in same if r["rollgym"] and not any(r["rollgym"])]
    return (
        f"{len(results)} servers: {sum(1 for r in results if r.get('imports', True))} import, "
        f"{len(started)} start offline"
        + (
            f" ({len(fails)} of them fail every row on both agents: {', '.join(fails)})"
            if fails
            else ""
        )
        + ", "
        f"{sum(1 for r in started if r.get('ran_to_end'))} ran to the end under rollgym, "
        f"{len(same)} same reward as NeMo Gym's agent"
        + (
            f" ({len(zero)} of them pay 0 on every row on both sides, which shows little: "
            f"{', '.join(zero)})"
            if zero
            else ""
        )
    )


HEADS = {
    "0.4": """# NeMo Gym 0.4.0 resources servers under rollgym

Generated by `interop/sweep.py` (see its docstring and `interop/README.md`); regenerate with
the command(s) below. For each resources server of NeMo Gym 0.4.0: does its `app.py` import in
the interop venv, does `gym env start` bring it up offline (with NeMo Gym's agent and
`openai_model` in front of rollgym's scripted model), does `rollgym run` with rollgym's agent
record every example row as a success, and does NeMo Gym's own agent (`/run`) pay the same
reward per row for the same model outputs. "outputs" says where the replayed model outputs
come from (`replay`: the server's recorded rollout of that task; `replay-own`: a recorded
rollout with its own task; `replay-other`: a recorded rollout of another task; `default`: the
scripted model's default).
""",
    "0.7": """# NeMo Gym 0.7.0 resources servers under rollgym

Generated by `interop/sweep.py --nemo 0.7` (see its docstring and `interop/README.md`);
regenerate with the command(s) below. For each resources server of NeMo Gym 0.7.0 (the 143
directories with an `app.py`): does its `app.py` import in the 0.7 interop venv (nemo-gym
0.7.0's own dependencies and math-verify), does `gym env start` bring it up offline (with
NeMo Gym's agent, an explicit `legacy_agent` Environment Server in front of it, and
`openai_model` in front of rollgym's scripted model), does `rollgym run` with rollgym's agent
record every example row as a success, and does NeMo Gym's own agent, reached through that
Environment Server's `/run` as 0.7's collector reaches it, pay the same reward per row for the
same model outputs. "outputs" says where the replayed model outputs come from (`replay`: the
server's recorded rollout of that task; `replay-own`: a recorded rollout with its own task;
`replay-other`: a recorded rollout of another task; `default`: the scripted model's default).
""",
}
MARKDOWN_HEAD = HEADS["0.4"]


def load(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(results, runs) of an earlier sweep's JSON (a bare list: results only)."""
    if not path.exists():
        return [], []
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return data, []
    return data["results"], data["runs"]


def save(
    args: argparse.Namespace,
    gym: NemoGym,
    results: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    *,
    show: bool = False,
) -> None:
    """Write ``--json`` (and ``--markdown``) from these results and runs."""
    results = sorted((complete(r, gym) for r in results), key=lambda r: r["server"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"runs": runs, "results": results}, indent=1))
    known = KNOWN if gym is NG04 else KNOWN07
    if show:
        print(table(results, known=known))
    if args.markdown:
        head = HEADS[args.nemo]
        args.markdown.write_text(head + "\n" + table(results, runs, known=known) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nemo", choices=sorted(nemo.RELEASES), default="0.4")
    parser.add_argument("--only", nargs="*", help="resources servers to sweep (default: all)")
    parser.add_argument(
        "--first",
        nargs="*",
        default=[],
        help="of the servers that may start, sweep these first (a sweep stopped part way has them)",
    )
    parser.add_argument("--rows", type=int, default=3, help="example rows per server")
    parser.add_argument("--work", type=Path, help="default: out/interop-sweep[07]")
    parser.add_argument("--json", type=Path, help="default: out/interop-sweep[07].json")
    parser.add_argument(
        "--markdown", type=Path, help="also write the table, with date, command and wall time"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="update --json (and --markdown) with these servers' results, keeping the others",
    )
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="sweep nothing: rewrite the table (--markdown) from --json",
    )
    args = parser.parse_args()
    gym = nemo.RELEASES[args.nemo]
    suffix = "" if gym is NG04 else args.nemo.replace(".", "")
    args.work = args.work or Path(f"out/interop-sweep{suffix}")
    args.json = args.json or Path(f"out/interop-sweep{suffix}.json")
    if args.table_only:
        results, runs = load(args.json)
        save(args, gym, results, runs, show=True)
        return 0
    # Ctrl-C or SIGTERM ends the sweep through its finally blocks (servers and Ray stopped);
    # a shell starting it with & would otherwise leave SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)

    begun = time.monotonic()
    servers_dir = gym.site_packages() / "resources_servers"
    names = args.only or sorted(p.name for p in servers_dir.iterdir() if (p / "app.py").exists())
    run: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([".venv/bin/python -m interop.sweep", *sys.argv[1:]]),
        "wall_s": 0,
        "servers": names,
        "stopped": True,  # until the last server is done
    }
    earlier, runs = load(args.json) if args.merge else ([], [])
    runs = [*runs, run]
    mine: list[dict[str, Any]] = []

    def record(result: dict[str, Any]) -> None:
        mine.append(result)
        print(json.dumps(result), flush=True)
        run["wall_s"] = round(time.monotonic() - begun)
        done = {r["server"] for r in mine}
        save(args, gym, [r for r in earlier if r["server"] not in done] + mine, runs)

    errors = import_errors(names, gym)
    # Servers that cannot start (an import error, a config that is not offline) take no time:
    # they come first, then --first in its order, then the rest in name order.
    first = {n: i for i, n in enumerate(args.first)}
    names = sorted(names, key=lambda n: (_may_start(n, errors, gym), first.get(n, len(first))))
    args.work.mkdir(parents=True, exist_ok=True)
    model_config = write_config(
        args.work / "model.yaml", {"servers": {"model": {"kind": "model", "impl": "scripted"}}}
    )
    with rollgym_serve(model_config) as urls:
        for name in names:
            if errors.get(name):
                record(
                    {
                        "server": name,
                        "imports": False,
                        "started": False,
                        "note": _offline_reason(f"import: {errors[name]}"),
                    }
                )
            else:
                record(sweep_one(name, urls["model"][0], args.work.resolve(), args.rows, gym))
    run["stopped"] = False
    run["wall_s"] = round(time.monotonic() - begun)
    done = {r["server"] for r in mine}
    save(args, gym, [r for r in earlier if r["server"] not in done] + mine, runs, show=True)
    return 0


def _may_start(name: str, errors: dict[str, str | None], gym: NemoGym) -> bool:
    if errors.get(name):
        return False
    try:
        server_fields(name, gym)
    except (LookupError, OSError, yaml.YAMLError, KeyError, ValueError):
        return False
    return True


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
