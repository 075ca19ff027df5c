"""NeMo RL's calling pattern for NeMo Gym, written again in our own words (stdlib only).

What ``nemo_rl/environments/nemo_gym.py`` (NVIDIA-NeMo/RL 7ea279a) does with NeMo Gym:

- ``NemoGym._spinup``: copy ``env.nemo_gym``, drop ``effort_levels`` and
  ``pad_dynamic_image_shapes``, set ``policy_model_name``, ``policy_api_key="dummy_key"``,
  ``policy_base_url`` (the list of per-DP-rank vLLM URLs), ``default_host`` (setdefault: the
  node's IP), ``port_range_low/high``, the two aiohttp connector limits (setdefault),
  ``ray_head_node_address`` and ``head_server={"host": "0.0.0.0", "port": <free port of the
  range>}``; then ``RunHelper().start(GlobalConfigDictParserConfig(dotenv_path=...,
  initial_global_config_dict=DictConfig(...), skip_load_from_cli=True))``,
  ``BaseServerConfig(host=<node ip>, port=<head port>)`` and ``RolloutCollectionHelper()``;
- ``run_rollouts``: ``run_examples(examples=rows, head_server_config=...)``, await each task;
  an exception carrying an HTTP ``status`` becomes its typed failure and ends the call;
- ``_postprocess_nemo_gym_to_nemo_rl_result``: the checks in ``postprocess`` below;
- ``nemo_rl/experience/rollouts.py``: ``_prepare_nemo_gym_rows`` (``prepare_rows``), and the
  sample's ``reward`` and ``instance_config.mask_sample``.

It imports only the standard library and the four ``nemo_gym`` names, so the same code drives
NeMo Gym 0.7 (in its own venv) and rollgym (its ``nemo_gym`` shim first on ``sys.path``): run
as a script, ``python tests/support/nemo_rl.py SPEC.json OUT.json``. NeMo RL passes an
omegaconf ``DictConfig``; this passes one when omegaconf is importable, else a plain dict.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
from pathlib import Path
from typing import Any

PORT_LOW, PORT_HIGH = 5000, 6000  # NeMo RL's DEFAULT_GYM_PORT_RANGE_LOW / _HIGH
MAX_NEW_TOKENS = 512


def free_port(low: int, high: int) -> int:
    """NeMo RL's ``_get_free_port_local``: a port of the range nothing listens on."""
    for port in range(low, high):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{low}, {high})")


def nemo_gym_names() -> dict[str, Any]:
    """The names NeMo RL imports, imported as it imports them."""
    from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig

    return {
        "GlobalConfigDictParserConfig": GlobalConfigDictParserConfig,
        "RunHelper": RunHelper,
        "RolloutCollectionHelper": RolloutCollectionHelper,
        "HEAD_SERVER_KEY_NAME": HEAD_SERVER_KEY_NAME,
        "BaseServerConfig": BaseServerConfig,
    }


def _dict_config(data: dict[str, Any]) -> Any:
    try:
        from omegaconf import DictConfig
    except ImportError:
        return data
    return DictConfig(data)


class NemoRLActor:
    """``NemoGym._spinup`` on construction, then ``run_rollouts``; ``names``: the four
    ``nemo_gym`` names (``nemo_gym_names()``); ``cfg``: NeMo RL's ``NemoGymConfig``
    (``model_name``, ``base_urls``, ``initial_global_config_dict``, ``port_range_low/high``)."""

    def __init__(self, names: dict[str, Any], cfg: dict[str, Any], dotenv: Path) -> None:
        self.node_ip = "127.0.0.1"
        low = cfg.get("port_range_low", PORT_LOW)
        high = cfg.get("port_range_high", PORT_HIGH)
        self.head_port = free_port(low, high)
        initial = dict(cfg.get("initial_global_config_dict") or {})
        initial.pop("effort_levels", None)
        initial.pop("pad_dynamic_image_shapes", None)
        initial["policy_model_name"] = cfg["model_name"]
        initial["policy_api_key"] = "dummy_key"
        initial["policy_base_url"] = cfg["base_urls"]
        initial.setdefault("default_host", self.node_ip)
        initial["port_range_low"] = low
        initial["port_range_high"] = high
        initial.setdefault("global_aiohttp_connector_limit_per_host", 16_384)
        initial.setdefault("global_aiohttp_connector_limit", 65_536)
        if cfg.get("ray_head_node_address"):  # NeMo RL's Ray; without one, 0.7 starts its own
            initial["ray_head_node_address"] = cfg["ray_head_node_address"]
        initial[names["HEAD_SERVER_KEY_NAME"]] = {"host": "0.0.0.0", "port": self.head_port}
        self.rh = names["RunHelper"]()
        self.rh.start(
            global_config_dict_parser_config=names["GlobalConfigDictParserConfig"](
                dotenv_path=dotenv,
                initial_global_config_dict=_dict_config(initial),
                skip_load_from_cli=True,
            )
        )
        self.head_server_config = names["BaseServerConfig"](host=self.node_ip, port=self.head_port)
        self.rch = names["RolloutCollectionHelper"]()

    async def run_rollouts(
        self, rows: list[dict[str, Any]], *, keep_going: bool = False
    ) -> list[tuple[int, Any]]:
        """(``_rowidx``, result) of every row, in finishing order. As NeMo RL, the first
        awaitable that raises ends the call (``AssertionError`` naming it); ``keep_going``
        records ``{"raised": {type, status, message}}`` for it instead and goes on (to compare
        with a side that does not raise)."""
        prepare_rows(rows)
        done: list[tuple[int, Any]] = []
        pending = {row["_rowidx"] for row in rows}
        for task in self.rch.run_examples(
            examples=rows, head_server_config=self.head_server_config
        ):
            try:
                row, result = await task
            except Exception as error:
                status = getattr(error, "status", None)
                if not keep_going:
                    raise AssertionError(f"the step fails: HTTP {status}: {error}") from error
                raised = {"type": type(error).__name__, "status": status, "message": str(error)}
                done.append((-1, {"raised": raised}))
                continue
            pending.discard(row["_rowidx"])
            done.append((row["_rowidx"], result))
        # A raised awaitable does not say which row it was: the rows never seen.
        missing = sorted(pending)
        return [(missing.pop(0) if i == -1 else i, r) for i, r in done]


def prepare_rows(rows: list[dict[str, Any]]) -> None:
    """``_prepare_nemo_gym_rows``: NeMo RL's sampling parameters and a stable row index."""
    for index, row in enumerate(rows):
        params = row["responses_create_params"]
        params["temperature"] = 1.0
        params["top_p"] = 1.0
        mine = params.get("max_output_tokens")
        params["max_output_tokens"] = MAX_NEW_TOKENS if mine is None else min(mine, MAX_NEW_TOKENS)
        row["_rowidx"] = index


def postprocess(row: dict[str, Any], result: Any) -> dict[str, Any]:
    """What NeMo RL's post-processing requires of a result, checked as it checks it (it pops
    the token fields: pass a copy to keep them). Raises where NeMo RL raises."""
    assert isinstance(result, dict), f"a non-successful response: {result}"
    assert isinstance(row["agent_ref"]["name"], str)  # NeMo RL counts rows per agent
    result["responses_create_params"].get("input", [])
    seen: list[int] = []
    turns = []
    for item in result["response"]["output"]:
        if not item.get("generation_token_ids"):
            continue  # not a trained turn
        prompt = item["prompt_token_ids"]
        assert seen == prompt[: len(seen)], "Non-contiguous messages found!"
        prompt = item.pop("prompt_token_ids")
        generated = item.pop("generation_token_ids")
        logprobs = item.pop("generation_log_probs")
        assert not any(math.isnan(x) for x in logprobs), "Generation logprobs contain NaN"
        turns.append((prompt[len(seen) :], generated))
        seen = [*seen, *prompt[len(seen) :], *generated]
    if not turns:
        raise ValueError("NeMo Gym returned a result with no generation data")
    return {
        "turns": turns,
        "reward": float(result["reward"]),
        "mask_sample": bool((result.get("instance_config") or {}).get("mask_sample", False)),
        "full_result": result,
    }


def main(argv: list[str]) -> int:
    """``SPEC.json`` (``cfg``: NeMo RL's ``NemoGymConfig``, ``rows``, ``dotenv``) -> ``OUT.json``
    (``results``: ``[rowidx, result]`` in finishing order, ``post``: ``{rowidx: what
    postprocess read, or the error it raised}``, ``poll``)."""
    spec = json.loads(Path(argv[1]).read_text())
    actor = NemoRLActor(nemo_gym_names(), spec["cfg"], Path(spec["dotenv"]))
    try:
        actor.rh.poll()
        results = asyncio.run(actor.run_rollouts(spec["rows"], keep_going=True))
        post: dict[str, Any] = {}
        rows = {row["_rowidx"]: row for row in spec["rows"]}
        for index, result in results:
            try:
                read = postprocess(rows[index], json.loads(json.dumps(result)))
                post[str(index)] = {k: read[k] for k in ("turns", "reward", "mask_sample")}
            except Exception as exc:  # what NeMo RL would raise for this row
                post[str(index)] = {"error": f"{type(exc).__name__}: {exc}"}
        out = {"results": results, "post": post, "poll": "ok"}
        try:
            actor.rh.poll()
        except RuntimeError as exc:
            out["poll"] = str(exc)
        Path(argv[2]).write_text(json.dumps(out))
    finally:
        actor.rh.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
