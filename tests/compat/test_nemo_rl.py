"""NeMo RL's calling pattern against rollgym's entry points (``rollgym.integrations.nemo_rl``), for real.

The tests do what ``nemo_rl/environments/nemo_gym.py`` (NVIDIA-NeMo/RL 7ea279a) does, written
again in our own words in ``tests.support.nemo_rl`` (which ``interop/test_ng07_nemo_rl.py``
also runs against NeMo Gym 0.7 itself): import the four names from ``nemo_gym`` (here
rollgym's shim, first on ``sys.path``), spin up as ``NemoGym._spinup`` does (its keys, a free
head port in the port range, ``RunHelper().start(GlobalConfigDictParserConfig(...))``,
``BaseServerConfig(host, port)``, ``RolloutCollectionHelper()``), prepare rows as
``_prepare_nemo_gym_rows`` does, call ``run_examples(examples=rows, head_server_config=...)``,
await each, and post-process as ``_postprocess_nemo_gym_to_nemo_rl_result`` checks (token
contiguity, the required token fields, at least one trained turn, no NaN logprob), reading
``reward`` and ``instance_config.mask_sample`` as ``rollouts.py`` does. NeMo RL passes an
omegaconf ``DictConfig``; here a plain dict (omegaconf is not installed; both are mappings).

The model: two vLLM-shaped upstreams (``tests.models.vllm_double``, NeMo RL's per-DP-rank
URLs) behind rollgym's ``openai_proxy`` with ``return_token_ids``, so every model call carries
token ids; a row saying FAIL-ME gets 500s from them, a row saying DRIFT-ME gets a chat template
that re-renders the model's tool call (re-tokenization drift). Real server processes, sockets.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import types
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rollgym.errors import ConfigError, HTTPStatusError, RollgymError, RunAborted, chain_text
from rollgym.integrations import nemo_rl
from rollgym.integrations.nemo_rl.plan import RollgymCompatWarning, global_config, make_plan, plain
from rollgym.testing import serve_asgi
from tests.models.vllm_double import END, GEN_PROMPT, VllmDouble, ids
from tests.support.background import in_thread
from tests.support.nemo_rl import (
    PORT_HIGH,
    PORT_LOW,
    NemoRLActor,
    nemo_gym_names,
    postprocess,
    prepare_rows,
)
from tests.support.procs import still_alive
from tests.support.stack import ECHO_TOOL, FAST_RETRY
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(240)

FAIL = "FAIL-ME"
DRIFT = "DRIFT-ME"


class TrainingDouble(VllmDouble):
    """The vLLM double, failing a row that says FAIL-ME (500, as a dying engine) and drifting
    on one that says DRIFT-ME."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        if FAIL in json.dumps(body.get("messages")):
            self.failed += 1
            return JSONResponse({"error": {"message": "engine died", "code": 500}}, 500)
        return await super()._chat(request)

    def render(self, messages: list[dict[str, Any]]) -> str:
        self.drift = DRIFT in json.dumps(messages)
        return super().render(messages)


def rollgym_config(**collect: Any) -> dict[str, Any]:
    """A rollgym config written for NeMo RL: its model takes NeMo RL's URLs and model name."""
    return {
        "servers": {
            "policy_model": {
                "kind": "model",
                "impl": "openai_proxy",
                "retry": {**FAST_RETRY, "max_attempts": 2},
                "options": {
                    "base_url": "${policy_base_url}",
                    "model": "${policy_model_name}",
                    "return_token_ids": True,
                    "upstream_retry": {**FAST_RETRY, "max_attempts": 2},
                },
            },
            "echo": {"kind": "resources", "impl": "echo", "retry": FAST_RETRY},
            "agent": {
                "kind": "agent",
                "impl": "tool_agent",
                "options": {"model": "policy_model", "resources": "echo"},
            },
        },
        "collect": {"agent_aliases": {"echo_simple_agent": "agent"}, **collect},
    }


# -- NeMo RL's side (tests.support.nemo_rl) ----------------------------------------------------


@pytest.fixture(scope="module")
def nemo_gym() -> Iterator[dict[str, Any]]:
    """The names NeMo RL imports, imported as NeMo RL imports them (rollgym's shim first on
    ``sys.path``); ``nemo_gym`` is gone from ``sys.modules`` afterwards."""
    sys.path.insert(0, str(nemo_rl.shim_path()))
    try:
        names = nemo_gym_names()
        assert names["RunHelper"] is nemo_rl.RunHelper
        yield names
    finally:
        sys.path.remove(str(nemo_rl.shim_path()))
        for name in [m for m in sys.modules if m == "nemo_gym" or m.startswith("nemo_gym.")]:
            del sys.modules[name]


async def step(actor: NemoRLActor, rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """One NeMo RL step: ``run_rollouts``, then each result post-processed as NeMo RL does."""
    done = await actor.run_rollouts(rows)
    return {index: postprocess(rows[index], result) for index, result in done}


def row(text: str, expected: str, agent: str = "echo_simple_agent") -> dict[str, Any]:
    return {
        "responses_create_params": {"input": text, "tools": [ECHO_TOOL], "max_output_tokens": 64},
        "expected_answer": expected,
        "agent_ref": {"name": agent},
    }


# -- the stack ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstreams() -> Iterator[list[TrainingDouble]]:
    """Two vLLM data-parallel ranks, on a thread of their own (start blocks this one)."""
    ranks = [TrainingDouble(), TrainingDouble()]
    with in_thread(serve_asgi(ranks[0].app)) as a, in_thread(serve_asgi(ranks[1].app)) as b:
        for rank, url in zip(ranks, (a, b), strict=True):
            rank.url = url  # type: ignore[attr-defined]
        yield ranks


@pytest.fixture(scope="module")
def actor(
    nemo_gym: dict[str, Any],
    upstreams: list[TrainingDouble],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[NemoRLActor]:
    cfg = {
        "model_name": "toy",
        "base_urls": [f"{u.url}/v1" for u in upstreams],  # type: ignore[attr-defined]
        "initial_global_config_dict": {"rollgym_config": rollgym_config(), "effort_levels": {}},
        "ray_head_node_address": "127.0.0.1:6379",  # NeMo RL's Ray (rollgym does not join it)
    }
    dotenv = tmp_path_factory.mktemp("nemo_rl") / "nemo_gym_env.yaml"  # absent, as usually
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = NemoRLActor(nemo_gym, cfg, dotenv)
    started.warnings = [  # type: ignore[attr-defined]
        str(w.message) for w in caught if w.category is RollgymCompatWarning
    ]
    try:
        yield started
    finally:
        started.rh.shutdown()


@pytest.fixture(autouse=True)
async def close_pools(request: pytest.FixtureRequest) -> Any:
    """Each test's event loop is its own: the helper's pool for it is closed with it."""
    yield
    if "actor" in request.fixturenames:
        await request.getfixturevalue("actor").rch.aclose()


# -- the tests ---------------------------------------------------------------------------------


def test_the_keys_rollgym_does_not_use_are_named_once(actor: NemoRLActor) -> None:
    assert len(actor.warnings) == 1  # type: ignore[attr-defined]
    text = actor.warnings[0]  # type: ignore[attr-defined]
    for key in ("ray_head_node_address", "global_aiohttp_connector_limit_per_host"):
        assert key in text
    assert "policy_api_key (the rollgym config never says ${policy_api_key})" in text
    for used in ("policy_base_url", "policy_model_name", "port_range_low", "head_server"):
        assert f"{used} (" not in text and f"{used};" not in text


def test_the_servers_take_nemo_rls_host_ports_and_model_urls(
    actor: NemoRLActor, upstreams: list[TrainingDouble]
) -> None:
    actor.rh.poll()  # NemoGym.health_check
    with pytest.raises(RuntimeError, match="started already"):
        actor.rh.start(nemo_rl.GlobalConfigDictParserConfig())
    url = f"http://127.0.0.1:{actor.head_port}/rollgym_layout"
    with urllib.request.urlopen(url, timeout=10) as answer:
        layout = json.loads(answer.read())
    for name, urls in layout["urls"].items():
        for server_url in urls:
            port = int(server_url.rsplit(":", 1)[1])
            assert server_url.startswith("http://127.0.0.1:"), name
            assert PORT_LOW <= port < PORT_HIGH and port != actor.head_port, name
    options = layout["config"]["servers"]["policy_model"]["options"]
    assert options["base_url"] == [f"{u.url}/v1" for u in upstreams]  # type: ignore[attr-defined]
    assert options["model"] == "toy"
    assert layout["policy_model"] == "policy_model"


async def test_a_step_trains_on_every_row_and_masks_the_failed_and_drifted_ones(
    actor: NemoRLActor, upstreams: list[TrainingDouble]
) -> None:
    rows = [
        row("please echo v0", "v0"),
        row("please echo v0", "v0"),  # the same prompt again: a GRPO group of two
        row("please echo v1", "v9"),  # a wrong answer: reward 0, trained on
        row(f"please echo {FAIL}", "x"),  # the model fails: masked, not reward 0
        row(f"please {DRIFT} echo v3", "v3"),  # the template drifts: masked
    ]
    done = await step(actor, rows)
    assert sorted(done) == [0, 1, 2, 3, 4]  # every row came back, the step goes on

    for index in (0, 1):
        sample = done[index]
        assert (sample["reward"], sample["mask_sample"]) == (1.0, False)
        result = sample["full_result"]
        assert result["mask_sample"] is False and "instance_config" not in result
        assert "task_index" not in result and "rollout_index" not in result  # rollgym's stamps
        assert "rollgym_upstream" not in result["response"]
        first_prompt, first_gen = sample["turns"][0]
        assert first_prompt == ids(f"<user>please echo v0{END}{GEN_PROMPT}")
        assert first_gen == ids('<call>echo {"text":"v0"}</call>' + END)
        assert len(sample["turns"]) == 2  # the tool call, then the answer: contiguous
    assert (done[2]["reward"], done[2]["mask_sample"]) == (0.0, False)

    failed = done[3]
    result = failed["full_result"]
    assert (failed["reward"], failed["mask_sample"]) == (0.0, True)
    assert result["mask_sample"] is True and result["instance_config"] == {"mask_sample": True}
    assert result["rollgym_mask_reason"] == "rollout_failed"
    error = RollgymError.from_dict(result["rollgym_error"])
    assert isinstance(error, HTTPStatusError) and error.server == "agent"
    root = error.root()  # one of NeMo RL's vLLM ranks: policy_model.upstream[0] or [1]
    assert root.status == 500 and str(root.server).startswith("policy_model.upstream[")
    assert result["failure_reason"] == chain_text(error) and "engine died" in chain_text(error)
    assert result["responses_create_params"] == rows[3]["responses_create_params"]
    # Its one turn: the row's prompt as the policy model tokenizes it, one placeholder id.
    assert failed["turns"] == [
        (ids(f"<user>please echo {FAIL}{END}{GEN_PROMPT}"), [ids(GEN_PROMPT)[-1]])
    ]
    assert sum(u.failed for u in upstreams) >= 1

    drifted = done[4]
    result = drifted["full_result"]
    assert drifted["mask_sample"] is True and result["mask_sample"] is True
    assert result["rollgym_mask_reason"] == "token_data"
    assert "drift" in result["failure_reason"]
    assert drifted["reward"] == 1.0  # the verifier's, kept: the sample is masked, not rescored
    assert len(drifted["turns"]) == 1  # the turns after the drift carry no token ids


async def test_a_failure_raises_its_typed_error_when_asked(actor: NemoRLActor) -> None:
    rch = nemo_rl.RolloutCollectionHelper(on_failure="raise")
    rows = [row(f"please echo {FAIL}", "x"), row("please echo v5", "v5")]
    outcomes: list[Any] = []
    for task in rch.run_examples(rows, actor.head_server_config):
        try:
            outcomes.append(await task)
        except HTTPStatusError as err:  # NeMo RL reads .status: an infrastructure failure
            outcomes.append(err)
    errors = [o for o in outcomes if isinstance(o, HTTPStatusError)]
    assert len(errors) == 1 and isinstance(errors[0].status, int) and errors[0].status >= 500
    # route_failures_to_sidecar: never raised, the masked result instead
    masked = [await t for t in rch.run_examples(rows[:1], actor.head_server_config, None, True)]
    assert masked[0][1]["mask_sample"] is True
    await rch.aclose()


async def test_a_drained_row_is_masked_and_marked_as_0_7_marks_it(actor: NemoRLActor) -> None:
    rows = [row("please echo v6", "v6"), row("please echo v7", "v7")]
    # No head_server_config: the head server of the RunHelper started in this process.
    results = [await t for t in actor.rch.run_examples(rows, dispatch_budget_s=0.0)]
    for got_row, result in results:
        assert got_row is rows[0] or got_row is rows[1]  # the caller's own dicts
        assert result["_ng_failure_class"] == "cancelled" and result["_ng_dispatch_drained"]
        assert result["rollgym_mask_reason"] == "not_dispatched"
        assert result["instance_config"] == {"mask_sample": True}
        postprocess(got_row, result)  # NeMo RL takes it: one placeholder turn


async def test_results_come_in_finishing_order_with_at_most_the_resident_tasks(
    actor: NemoRLActor, upstreams: list[TrainingDouble]
) -> None:
    before = sum(len(u.requests) for u in upstreams)
    rows = [row(f"please echo w{i}", f"w{i}") for i in range(4)]
    tasks = iter(actor.rch.run_examples(rows, actor.head_server_config, max_resident_tasks=1))
    first = await next(tasks)
    # One rollout at a time: the first has finished (2 model calls) before the second starts.
    assert first[1]["reward"] == 1.0
    rest = [await t for t in tasks]
    assert {r["expected_answer"] for r, _ in [first, *rest]} == {f"w{i}" for i in range(4)}
    assert sum(len(u.requests) for u in upstreams) - before == 8


def test_unknown_keywords_and_unknown_agents_fail_before_anything_runs(
    actor: NemoRLActor,
) -> None:
    with pytest.raises(TypeError):
        actor.rch.run_examples([], actor.head_server_config, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"examples\[0\].*'nobody'"):
        actor.rch.run_examples([row("x", "x", agent="nobody")], actor.head_server_config)
    with pytest.warns(RollgymCompatWarning, match="latency_tracker"):
        actor.rch.run_examples([], actor.head_server_config, latency_tracker=object())


def test_a_server_that_dies_is_restarted_and_poll_stays_quiet(actor: NemoRLActor) -> None:
    (old,) = actor.rh.pids()["echo"]
    os.kill(old, signal.SIGKILL)

    def restarted() -> bool:
        pids = actor.rh.pids()["echo"]
        return bool(pids) and pids[0] != old

    wait_for(restarted, 60, "the watchdog to restart echo")
    actor.rh.poll()


async def test_a_step_after_the_restart_scores_again(actor: NemoRLActor) -> None:
    done = await step(actor, [row("please echo v8", "v8")])
    assert (done[0]["reward"], done[0]["mask_sample"]) == (1.0, False)


def test_shutdown_leaves_no_process(actor: NemoRLActor) -> None:
    pids = [p for ps in actor.rh.pids().values() for p in ps]
    assert len(pids) == 3
    actor.rh.shutdown()
    assert still_alive(pids) == []
    # Nothing of ours listens on the head server's port any more. Not "the port can be bound":
    # freed, it may be taken at once by another process (a second test run scans the range).
    ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    listening = {
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == actor.head_port
    }
    assert not listening & ours, listening
    actor.rh.shutdown()  # again: nothing to do


# -- a broken model, a crash loop ---------------------------------------------------------------


async def test_a_broken_stack_aborts_the_step_and_poll_names_the_dead_server(
    nemo_gym: dict[str, Any], tmp_path: Path, dead_url: Callable[[], str]
) -> None:
    cfg = {
        "model_name": "toy",
        "base_urls": [dead_url() + "/v1"],  # the vLLM rank is gone
        "initial_global_config_dict": {
            "rollgym_config": rollgym_config(min_failure_samples=2),
            "model_endpoint_readiness_timeout_seconds": 0,
            "rollgym_max_restarts": 0,
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RollgymCompatWarning)
        actor = NemoRLActor(nemo_gym, cfg, tmp_path / "nemo_gym_env.yaml")
    try:
        rows = [row(f"please echo v{i}", f"v{i}") for i in range(6)]
        prepare_rows(rows)
        masked, aborted = [], []
        # One at a time: the budget (2 samples) stops the batch after the second failure.
        tasks = actor.rch.run_examples(
            examples=rows, head_server_config=actor.head_server_config, max_resident_tasks=1
        )
        for task in tasks:
            try:
                masked.append(postprocess(*await task))
            except RunAborted as err:
                aborted.append(err)
        assert (len(masked), len(aborted)) == (2, 4)
        assert all(s["mask_sample"] and s["reward"] == 0.0 for s in masked)
        # The model could not tokenize either: the placeholder prompt.
        assert all(s["turns"] == [([0], [0])] for s in masked)
        assert "2 of the last 2 rollouts failed" in aborted[0].message

        (echo,) = actor.rh.pids()["echo"]
        os.kill(echo, signal.SIGKILL)

        def poll_fails() -> bool:
            try:
                actor.rh.poll()
            except RuntimeError as err:
                return "echo" in str(err)
            return False

        wait_for(poll_fails, 30, "poll to report the dead echo server")
        pids = [p for ps in actor.rh.pids().values() for p in ps]
    finally:
        actor.rh.shutdown()
    assert still_alive(pids) == []


# -- the config, without servers ----------------------------------------------------------------


def plan_of(initial: dict[str, Any], dotenv: Path | None = None) -> Any:
    settings = global_config(initial, dotenv, skip_dotenv=False, skip_cli=True)
    return make_plan(settings)


def test_a_nemo_gym_config_without_a_rollgym_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rollgym_config"):
        plan_of({"config_paths": ["resources_servers/mcqa/configs/mcqa.yaml"]}, tmp_path / "x")


def test_a_placeholder_without_its_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="policy_base_url"):
        plan_of({"rollgym_config": rollgym_config()}, tmp_path / "x")


def test_the_rollgym_config_may_come_from_a_file_named_in_the_dotenv(tmp_path: Path) -> None:
    config = tmp_path / "rollgym.yaml"
    config.write_text(json.dumps(rollgym_config(concurrency=7)))
    dotenv = tmp_path / "nemo_gym_env.yaml"
    dotenv.write_text(f"rollgym_config: {config}\npolicy_model_name: from-dotenv\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = plan_of({"policy_base_url": "http://gpu:8000/v1", "policy_model_name": "m"}, dotenv)
    assert plan.config.source == str(config)
    options = plan.config.servers["policy_model"].options
    assert options == {**options, "base_url": "http://gpu:8000/v1", "model": "m"}
    assert plan.concurrency == 7 and plan.policy_model == "policy_model"
    assert not [w for w in caught if w.category is RollgymCompatWarning]


def test_the_readmes_nemo_rl_config_gives_one_proxy_replica_per_rank(tmp_path: Path) -> None:
    # examples/nemo_rl/train.yaml is the README's snippet, word for word.
    config = Path(__file__).resolve().parents[2] / "examples" / "nemo_rl" / "train.yaml"
    ranks = ["http://gpu0:8000/v1", "http://gpu1:8000/v1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = plan_of(
            {"rollgym_config": str(config), "policy_base_url": ranks, "policy_model_name": "m"},
            tmp_path / "absent.yaml",
        )
    options = plan.config.servers["policy_model"].options
    assert options["base_url"] == ranks and options["model"] == "m"
    assert options["return_token_ids"] is True
    assert plan.policy_urls == tuple(ranks) and plan.policy_model == "policy_model"
    assert plan.config.collect.agent_aliases == {"mcqa_simple_agent": "agent"}
    assert not [w for w in caught if w.category is RollgymCompatWarning]


def test_a_list_inside_a_longer_string_is_refused(tmp_path: Path) -> None:
    config = rollgym_config()
    config["servers"]["policy_model"]["options"]["model"] = "x-${policy_base_url}"
    with pytest.raises(ConfigError, match="alone"):
        plan_of({"rollgym_config": config, "policy_base_url": ["a", "b"]}, tmp_path / "x")


def test_an_omegaconf_config_is_read_with_its_placeholders_unresolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NeMo RL passes a ``DictConfig``: read through ``OmegaConf.to_container(resolve=False)``,
    so ``${policy_base_url}`` is rollgym's to substitute (and to report when unused). omegaconf
    is not installed here: a stand-in with its names."""
    asked: list[bool] = []

    class DictConfig(dict[str, Any]):
        pass

    DictConfig.__module__ = "omegaconf.dictconfig"

    class OmegaConf:
        @staticmethod
        def to_container(cfg: DictConfig, *, resolve: bool) -> dict[str, Any]:
            asked.append(resolve)
            return dict(cfg)

    fake = types.ModuleType("omegaconf")
    fake.OmegaConf = OmegaConf  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "omegaconf", fake)
    assert plain(DictConfig({"base_url": "${policy_base_url}"})) == {
        "base_url": "${policy_base_url}"
    }
    assert asked == [False]


async def test_run_examples_masks_an_exploit_tagged_sample_when_the_config_says(
    nemo_gym: dict[str, Any],
    upstreams: list[TrainingDouble],
    tmp_path: Path,
) -> None:
    """``collect.mask_exploits`` in the rollgym config NeMo RL passes: a sample whose answer
    ends the process before the tests (``os._exit``) and is paid by the verifier reaches NeMo RL
    masked (``instance_config.mask_sample``, the reward kept, never a 0), its clean sibling not.
    Its own stack (another ``RunHelper``, shut down here; the module's stays the newest)."""
    cfg = {
        "model_name": "toy",
        "base_urls": [f"{u.url}/v1" for u in upstreams],  # type: ignore[attr-defined]
        "initial_global_config_dict": {
            "rollgym_config": rollgym_config(mask_exploits=True),
            "effort_levels": {},
        },
    }
    masking = NemoRLActor(nemo_gym, cfg, tmp_path / "nemo_gym_env.yaml")
    try:
        # The model double calls the echo tool with the prompt's last word and answers with
        # the tool's output: "os._exit(0)" is what it says, and the echo verifier pays it.
        done = await step(masking, [row("please echo os._exit(0)", "os._exit(0)"),
                                    row("please echo v8", "v8")])  # fmt: skip
    finally:
        await masking.rch.aclose()
        masking.rh.shutdown()
    exploit, clean = done[0], done[1]
    assert (exploit["reward"], exploit["mask_sample"]) == (1.0, True)
    result = exploit["full_result"]
    assert result["instance_config"] == {"mask_sample": True}
    assert result["integrity"]["verdict"] == "exploit" and result["integrity"]["masked"] is True
    assert result["rollgym_mask_reason"] == "exploit"
    assert (clean["reward"], clean["mask_sample"]) == (1.0, False)
    assert clean["full_result"]["integrity"]["verdict"] == "clean"
