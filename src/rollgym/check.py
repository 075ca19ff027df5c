"""``rollgym check``: an environment checker, in the spirit of Gymnasium's ``check_env``.

It starts the config's servers and, against the environment (a resources server), checks:
its tools' schemas; ``verify`` (or Gymnasium-style ``/reset`` + ``/step``) on the example rows
with a reference answer and a wrong one; that ``verify`` is deterministic; that two concurrent
sessions do not share state; that errors use the uniform error body. Which answers are right:
a row's ``rollgym_check: {"reference": TEXT, "wrong": TEXT}``, else the alternatives of the
last turn of its scripted model script, of which some must pass and some must not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import ValidationError

from rollgym.agents.gymnasium import parse_step
from rollgym.config import Config
from rollgym.errors import ConfigError, ProtocolError
from rollgym.launch.supervisor import Supervisor
from rollgym.models.scripted import build_response
from rollgym.protocol import FunctionTool
from rollgym.wire import OPENENV_FEATURE, SESSION_COOKIE, SESSION_HEADER

CHECK_FIELD = "rollgym_check"
_ERROR_KEYS = {"type", "message", "status", "server", "retryable"}


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str


@dataclass
class CheckReport:
    env: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    def add(self, check: str, ok: bool, detail: str) -> None:
        self.findings.append(Finding(check, ok, detail))


@dataclass(frozen=True)
class Answer:
    """One answer to try on a row; ``good`` None: unknown (a script's alternative)."""

    row: dict[str, Any]
    steps: list[dict[str, Any]]  # scripted tool calls to replay before verifying
    text: str
    good: bool | None


class _Env:
    """The environment's endpoints over one aiohttp session, with statuses kept."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def post(self, path: str, body: Any, sid: str | None = None) -> tuple[int, Any]:
        return (await self.post_session(path, body, sid))[:2]

    async def post_session(
        self, path: str, body: Any, sid: str | None = None
    ) -> tuple[int, Any, str | None]:
        """(status, body, the session the answer's cookie names)."""
        headers = {SESSION_HEADER: sid} if sid else {}
        async with self.http.post(self.url + path, json=body, headers=headers) as resp:
            cookie = resp.cookies.get(SESSION_COOKIE)
            return resp.status, await _json(resp), cookie.value if cookie else None

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path) as resp:
            return resp.status, await _json(resp)


async def _json(resp: aiohttp.ClientResponse) -> Any:
    try:
        return await resp.json(content_type=None)
    except ValueError:
        return None


def pick_env(config: Config, name: str | None) -> str:
    """The resources server to check: ``name``, or the config's only one."""
    envs = [n for n, s in config.servers.items() if s.kind == "resources"]
    if name is not None:
        if name not in envs:
            raise ConfigError(f"--server {name!r}: not a resources server ({', '.join(envs)})")
        return name
    if len(envs) != 1:
        raise ConfigError(f"{config.source}: name the environment with --server ({envs})")
    return envs[0]


def load_rows(config: Config, limit: int, env: str | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` example rows; with ``env``, only the rows run against that
    environment (a config of several, such as a mixed run: a row goes to the agent its
    ``agent_ref`` names, else to the run's default one, and that agent verifies with its
    ``resources``)."""
    if not config.collect.input:
        raise ConfigError(f"{config.source}: collect.input names no example rows to check with")
    path = config.base_dir() / config.collect.input
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    agents = [n for n, s in config.servers.items() if s.kind == "agent"]
    if env is not None and len(agents) > 1:
        from rollgym.collect.peers import resources_of  # the run's own reading of the options

        default = config.default_dispatcher()
        serving = {a for a in agents if resources_of(config, a) == env}

        def agent_of(row: dict[str, Any]) -> str | None:
            ref = row.get("agent_ref")
            name = ref.get("name") if isinstance(ref, dict) else None
            name = config.collect.agent_aliases.get(name, name) if name else None
            return name if name in config.servers else default

        rows = [r for r in rows if agent_of(r) in serving]
    return rows[:limit]


def answers(row: dict[str, Any]) -> list[Answer]:
    """The answers to try on ``row`` (see the module docstring)."""
    marked = row.get(CHECK_FIELD)
    if isinstance(marked, dict):
        return [
            Answer(row, [], str(marked[key]), key == "reference")
            for key in ("reference", "wrong")
            if key in marked
        ]
    metadata = row.get("responses_create_params", {}).get("metadata") or {}
    script = metadata.get("rollgym_script")
    script = json.loads(script) if isinstance(script, str) else script
    if not isinstance(script, list) or not script:
        return []
    say = script[-1].get("say") if isinstance(script[-1], dict) else None
    texts = say if isinstance(say, list) else [say] if isinstance(say, str) else []
    return [Answer(row, script[:-1], str(t), None) for t in texts]


async def check_env(
    config: Config, env: str | None = None, *, limit: int = 20, log_dir: Path | None = None
) -> CheckReport:
    """Start ``config``'s servers, check environment ``env``, stop them; the report."""
    name = pick_env(config, env)
    report = CheckReport(name)
    rows = load_rows(config, limit, name)
    supervisor = Supervisor(config, log_dir=log_dir)
    try:
        urls = await supervisor.start()
        timeout = aiohttp.ClientTimeout(total=120, connect=5)
        # No shared cookie jar: each check carries its own session, as agents do.
        jar = aiohttp.DummyCookieJar()
        async with aiohttp.ClientSession(timeout=timeout, cookie_jar=jar) as http:
            await _check(_Env(http, urls[name][0]), name, rows, config, report)
    finally:
        await supervisor.stop()
    return report


async def _check(
    env: _Env, name: str, rows: list[dict[str, Any]], config: Config, report: CheckReport
) -> None:
    status, health = await env.get("/health")
    report.add("health", status == 200 and health.get("kind") == "resources", f"{status} {health}")
    if OPENENV_FEATURE in (health.get("features") or ()):
        # A foreign OpenEnv app (impl: openenv) speaks OpenEnv's protocol, not rollgym's: none
        # of the checks below applies (its own /reset is OpenEnv's, not the Gymnasium-style one).
        report.add(
            "openenv", True, "an OpenEnv environment (impl: openenv): not checked by rollgym "
            "check; openenv_agent plays it (tests/openenv) and its reward is its own",
        )  # fmt: skip
        return
    gym = (await env.post("/reset", {}))[0] != 404
    if not gym:
        await _check_tools(env, report)
    score = _episode if gym else _verify
    threshold = config.collect.pass_threshold
    tried = [a for row in rows for a in answers(row)]
    if not tried:
        report.add("answers", False, "no row has rollgym_check or a scripted answer to try")
        return
    rewards = await _sequential(score, env, tried, report)
    if rewards is None:
        return
    _judge_answers(tried, rewards, threshold, report)
    again = await _sequential(score, env, tried, report)
    if again is not None:
        same = [i for i, (a, b) in enumerate(zip(rewards, again, strict=True)) if a != b]
        detail = f"{len(tried)} answers verified twice" + (
            f"; differ at {[tried[i].text[:40] for i in same[:3]]}" if same else ", same results"
        )
        report.add("deterministic", not same, detail)
    together = await asyncio.gather(*(score(env, a) for a in tried), return_exceptions=True)
    mixed = [i for i, r in enumerate(together) if r != rewards[i]]
    report.add(
        "sessions isolated",
        not mixed,
        f"{len(tried)} answers verified concurrently, each in its own session"
        + (f"; {len(mixed)} results changed" if mixed else ", results as when run alone"),
    )
    await _check_errors(env, name, gym, rows[0], report)


async def _sequential(
    score: Callable[[_Env, Answer], Awaitable[tuple[float, Any]]],
    env: _Env,
    tried: list[Answer],
    report: CheckReport,
) -> list[tuple[float, Any]] | None:
    out = []
    for answer in tried:
        try:
            out.append(await score(env, answer))
        except _Failed as exc:
            report.add("verify", False, f"{answer.text[:60]!r}: {exc}")
            return None
    return out


def _judge_answers(
    tried: list[Answer], rewards: list[tuple[float, Any]], threshold: float, report: CheckReport
) -> None:
    known = [(a, r) for a, (r, _) in zip(tried, rewards, strict=True) if a.good is not None]
    bad = [(a.text[:60], r) for a, r in known if (r >= threshold) != a.good]
    if known:
        report.add(
            "reference and wrong answers",
            not bad,
            f"{len(known)} marked answers scored as marked (threshold {threshold:g})"
            if not bad
            else f"scored against their marking: {bad[:3]}",
        )
    if len(known) < len(tried):  # script alternatives: the verifier must tell them apart
        passed = sum(r >= threshold for r, _ in rewards)
        report.add(
            "verifier discriminates",
            0 < passed < len(rewards),
            f"{passed} of {len(rewards)} scripted answers pass",
        )


class _Failed(Exception):
    pass


async def _verify(env: _Env, answer: Answer) -> tuple[float, Any]:
    """Seed a session, replay the script's tool calls, verify; (reward, sub-scores)."""
    row = answer.row
    status, body = await env.post("/seed_session", row)
    if status != 200:
        raise _Failed(f"/seed_session answered {status}: {str(body)[:300]}")
    sid = body.get("session_id")
    output = ""
    for turn in answer.steps:
        calls = turn.get("calls") or [
            {"name": turn.get("call"), "arguments": turn.get("arguments")}
        ]
        for call in calls:
            _, result = await env.post(f"/{call['name']}", call.get("arguments") or {}, sid)
            output = json.dumps(result, separators=(",", ":"))
    text = answer.text.replace("{tool_output}", output)
    response = build_response(row.get("responses_create_params", {}), {"say": text})
    status, body = await env.post("/verify", {**row, "response": response}, sid)
    reward = body.get("reward") if isinstance(body, dict) else None
    if status != 200 or not isinstance(reward, (int, float)) or isinstance(reward, bool):
        raise _Failed(f"/verify answered {status}: {str(body)[:300]}")
    scores = body.get("scores")
    if scores is not None and not (
        isinstance(scores, dict) and all(isinstance(v, (int, float)) for v in scores.values())
    ):
        raise _Failed(f"/verify 'scores' must map names to numbers, got {scores!r}")
    return float(reward), scores


async def _episode(env: _Env, answer: Answer) -> tuple[float, Any]:
    """Gymnasium-style: reset, then one step with the answer; (step reward, terminated)."""
    status, body, sid = await env.post_session("/reset", answer.row)
    if status != 200:
        raise _Failed(f"/reset answered {status}: {str(body)[:300]}")
    response = build_response(answer.row.get("responses_create_params", {}), {"say": answer.text})
    status, body = await env.post("/step", {**answer.row, "response": response}, sid)
    try:
        if status != 200:
            raise _Failed(f"/step answered {status}: {str(body)[:300]}")
        step = parse_step(body, "env")  # as strict as the gymnasium agent that plays it
    except ProtocolError as exc:
        raise _Failed(f"/step answered {status}: {exc.message}; {str(body)[:300]}") from None
    return step.reward, step.terminated


async def _check_tools(env: _Env, report: CheckReport) -> None:
    status, tools = await env.get("/tools")
    if status != 200 or not isinstance(tools, list):
        report.add("tools", False, f"GET /tools answered {status}: {str(tools)[:200]}")
        return
    problems: list[str] = []
    names = [t.get("name") for t in tools if isinstance(t, dict)]
    if len(set(names)) != len(names):
        problems.append(f"duplicate tool names {names}")
    for tool in tools:
        try:
            spec = FunctionTool.model_validate(tool)
        except ValidationError as exc:
            problems.append(
                f"{str(tool)[:80]}: not a Responses API function tool ({exc.errors()[0]['msg']})"
            )
            continue
        problems += [f"{spec.name}: {p}" for p in _schema_problems(spec.parameters or {})]
    report.add("tool schemas", not problems, "; ".join(problems[:5]) or f"{len(tools)} tools valid")


def _schema_problems(schema: dict[str, Any]) -> list[str]:
    if schema.get("type") != "object":
        return ["parameters must be a JSON schema of type 'object'"]
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        return ["'properties' must be an object"]
    missing = set(schema.get("required", [])) - set(props)
    untyped = [k for k, v in props.items() if not isinstance(v, dict) or not v]
    return [f"required but not defined: {sorted(missing)}"] * bool(missing) + [
        f"properties without a schema: {untyped}"
    ] * bool(untyped)


async def _check_errors(
    env: _Env, name: str, gym: bool, row: dict[str, Any], report: CheckReport
) -> None:
    """Malformed requests must be answered 4xx with the uniform error body."""
    probes: list[tuple[str, Any]] = [("/step" if gym else "/verify", ["not", "a", "row"])]
    probes.append(("/step" if gym else "/verify", {**row, "response": {"output": []}}))
    problems = []
    for path, body in probes:
        sid = None if path == "/reset" else "no-such-session"
        status, answer = await env.post(path, body, sid)
        error = answer.get("error") if isinstance(answer, dict) else None
        if not 400 <= status < 500:
            problems.append(f"{path}: answered {status}, not 4xx")
        elif not isinstance(error, dict) or not set(error) >= _ERROR_KEYS:
            problems.append(f"{path}: error body {str(answer)[:120]} lacks {sorted(_ERROR_KEYS)}")
        elif error.get("status") != status or error.get("server") != name:
            problems.append(
                f"{path}: body status/server {error.get('status')}/{error.get('server')}"
            )
    report.add("uniform error body", not problems, "; ".join(problems) or f"{len(probes)} probes")
