"""Run in a Python that has verifiers 0.4 (``tests/integrations/test_verifiers.py`` starts it).

Serves on 127.0.0.1 a rollgym ``lookup`` resources server (which records the session of every
call and fails on demand) and rollgym's scripted model (without a script: it calls the first
tool with the user's text, then says the tool's output), loads the Hub package ``rollgym-env``
(``verifiers_env/rollgym_env``) through verifiers' own loader, runs every row twice through
verifiers' rollout path (``env.serving()`` + ``env.run_slot``, as ``vf-eval`` does, with the
``null`` chat harness), then the same rows through rollgym's own tool agent, and prints one JSON
object with what both saw. The test makes the assertions.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.env import RunSlot

from rollgym.collect.records import FailedRollout, ScoredRollout
from rollgym.envs.lookup.server import LookupEnv
from rollgym.http import Target
from rollgym.protocol import output_text
from rollgym.server.resources import Session, tool
from rollgym.testing import serve_server
from rollgym.trainer import RolloutClient
from tests.support.stack import fast_policy

BREAK = "BREAK"
"""A lookup key containing this fails on the server's side (a 500, not the tool refusing)."""


class RecordingLookup(LookupEnv):
    """``lookup`` that records which session made each call and each verify, and fails on
    demand: a key with ``BREAK`` answers 500; a row's ``rig`` field makes seed or verify answer
    500 (``seed_500``, ``verify_500``) or verify ask to be masked (``mask``)."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.calls: dict[str, list[str]] = defaultdict(list)

    async def seed_session(self, session: Session) -> None:
        await super().seed_session(session)
        self.calls[session.id].append("seed")
        if session.task.get("rig") == "seed_500":
            raise RuntimeError("the registry is closed today")

    @tool
    async def lookup(self, session: Session, key: str) -> dict[str, Any]:
        """Look up a Norrowvale registry entry by key: a town name or a product code like QX-4471."""
        self.calls[session.id or "-"].append(f"lookup:{key}")
        if BREAK in key:
            raise RuntimeError("the registry's disk is on fire")
        return await super().lookup(session, key)

    async def verify(
        self, session: Session, task: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls[session.id or "-"].append("verify")
        verified = await super().verify(session, task, response)
        if task.get("rig") == "verify_500":
            raise RuntimeError("the verifier crashed")
        if task.get("rig") == "mask":
            return {**verified, "mask_sample": True}
        return verified


LOOKUP_TOOL = json.loads(
    (Path(__file__).parents[2] / "src/rollgym/envs/lookup/data/example.jsonl")
    .read_text()
    .splitlines()[0]
)["responses_create_params"]["tools"][0]


def row(question: str, expected: str, *, tools: bool = True, **extra: Any) -> dict[str, Any]:
    """A lookup row; it declares the tool (rollgym's tool agent offers only declared tools)."""
    params: dict[str, Any] = {"input": [{"role": "user", "content": question}]}
    if tools:
        params["tools"] = [LOOKUP_TOOL]
    return {"responses_create_params": params, "expected_answer": expected, **extra}


ROWS = [
    row("Brackenholt", "48213"),  # the tool's answer holds the population: 1.0
    row("Velmora", "1608"),  # the founding year: 1.0
    row("Velmora", "99999"),  # a wrong expectation: a real 0.0
    row("Atlantis", "1"),  # no such key: the tool refuses (404), the model says so: 0.0
    row(f"{BREAK} Brackenholt", "48213"),  # the tool's server fails: a failed rollout
    row("Brackenholt", "48213", rig="verify_500"),  # verify fails: a failed rollout
    row("Brackenholt", "48213", rig="mask"),  # verify masks it: a failed rollout
    # No tools declared: verifiers' rollout gets the server's (GET /tools); rollgym's tool agent
    # offers the model none, so this row is left out of the comparison.
    row("Brackenholt", "48213", tools=False),
    row("Brackenholt", "48213", rig="seed_500"),  # seed fails: a failed rollout, never run
]
REPEATS = 2


def trace_summary(trace: Any) -> dict[str, Any]:
    return {
        "ok": trace.ok,
        "rewards": {k: None if r is None else r.score for k, r in trace.rewards.items()},
        "reward": trace.reward,
        "metrics": dict(trace.metrics),
        "errors": [{"type": e.type, "message": e.message[:300]} for e in trace.errors],
        "stop_condition": trace.stop_condition,
        "rollgym_error": trace.info.get("rollgym_error"),
        "session_id": trace.state.session_id,
        "tool_calls": list(trace.state.tool_calls),
        "last_reply": trace.last_reply,
        "tools_seen": [t.name for t in trace.tools],
    }


async def run_verifiers(
    dataset: Path, resources_url: str, model_url: str
) -> list[list[dict[str, Any]]]:
    config = vf.resolve_env_config(
        {
            "taskset": {
                "id": "rollgym-env",
                "dataset": str(dataset),
                "task": {"resources_url": resources_url, "tool_timeout": 30, "verify_timeout": 30},
            },
            "agent": {"runtime": {"type": "subprocess"}, "max_turns": 6},
        }
    )
    env = vf.load_environment(config)
    tasks = list(env.taskset)
    ctx = vf.ModelContext(
        client=vf.EvalClientConfig(base_url=f"{model_url}/v1", api_key_var="ROLLGYM_UNUSED_KEY"),
        model="rollgym-scripted",
    )
    async with env.serving():
        episodes = await asyncio.gather(
            *(env.run_slot(RunSlot(task), ctx) for task in tasks for _ in range(REPEATS))
        )
    out: list[list[dict[str, Any]]] = [[] for _ in tasks]
    for i, episode in enumerate(episodes):
        (trace,) = episode.traces
        out[i // REPEATS].append(trace_summary(trace))
    return out


async def run_rollgym(model_url: str, env_url: str) -> list[dict[str, Any]]:
    peers = {
        "model": Target.single("model", model_url, fast_policy("model")),
        # named as the verifiers side names it: a tool's refusal names its server
        "resources": Target.single("resources", env_url, fast_policy("resources")),
    }
    options = {"model": "model", "resources": "resources"}
    async with serve_server("tool_agent", name="agent", options=options, peers=peers) as (
        agent_url,
        _,
    ):
        groups = await RolloutClient(agent_url).collect(ROWS, repeats=1, budget=None)
    out = []
    for group in groups:
        (record,) = group.rollouts
        if isinstance(record, FailedRollout):
            out.append({"failed": record.error.type, "message": record.error.message[:300]})
        else:
            assert isinstance(record, ScoredRollout)
            text = output_text(record.response)
            out.append(
                {
                    "reward": record.reward,
                    "masked": record.masked,
                    "text": text,
                    "tool_called": float(record.verified.get("tool_called", 0)),
                }
            )
    return out


async def main(workdir: Path) -> None:
    dataset = workdir / "rows.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    async with (
        serve_server("scripted", name="model") as (model_url, _),
        serve_server(RecordingLookup, name="resources") as (
            env_url,
            env,
        ),
    ):
        assert isinstance(env, RecordingLookup)
        verifiers_out = await run_verifiers(dataset, env_url, model_url)
        verifiers_calls = {k: list(v) for k, v in env.calls.items()}
        env.calls.clear()
        rollgym_out = await run_rollgym(model_url, env_url)
    print(
        json.dumps(
            {
                "verifiers": verifiers_out,
                "rollgym": rollgym_out,
                "sessions": verifiers_calls,
                "rows": ROWS,
            }
        )
    )


if __name__ == "__main__":
    os.environ.setdefault("ROLLGYM_UNUSED_KEY", "unused")
    asyncio.run(main(Path(sys.argv[1])))
