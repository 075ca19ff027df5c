"""The entry points NeMo RL calls, on rollgym's core: point NeMo RL here instead of NeMo Gym 0.7.

NeMo RL's Gym environment imports exactly these, and rollgym keeps their names and signatures::

    from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig

``shim_path()`` is a directory holding a ``nemo_gym`` package of those four modules, each
re-exporting this one: put it first on ``PYTHONPATH`` of NeMo RL's Gym actor (NeMo RL passes
its environment on) and NeMo RL runs on rollgym unchanged.

- ``RunHelper().start(GlobalConfigDictParserConfig(initial_global_config_dict=...,
  dotenv_path=..., skip_load_from_cli=True))`` starts the servers of the rollgym config that the
  global config names (``rollgym_config``; see ``plan`` for every key), waits until all
  answer (and NeMo RL's vLLM URLs do), and serves the head server. ``poll()`` raises
  ``RuntimeError`` when a server cannot be kept up (one that dies is restarted by the watchdog;
  ``rollgym_max_restarts`` within 60 s, default 3, then it is fatal). ``shutdown()`` stops every
  process it started and waits for each to end.
- ``RolloutCollectionHelper().run_examples(examples, head_server_config, ...)`` runs each row
  once through rollgym's rollout core and returns an iterator of awaitables, the k-th
  resolving to the k-th rollout finished as ``(row, result)`` (see ``collect``); ``result``
  is what NeMo RL post-processes (see ``results``): a failed rollout is a masked sample with
  its typed error, never a crash of NeMo RL's step and never a silent reward of 0.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rollgym.integrations.nemo_rl.collect import Batch, OnFailure, Pools, route_rows, tracker_of
from rollgym.integrations.nemo_rl.plan import (
    DEFAULT_HEAD_SERVER_PORT,
    HEAD_SERVER_KEY_NAME,
    RollgymCompatWarning,
    global_config,
    make_plan,
)
from rollgym.integrations.nemo_rl.stack import Layout, RunningStack
from rollgym.launch.ports import WILDCARD

__all__ = [
    "HEAD_SERVER_KEY_NAME",
    "BaseServerConfig",
    "GlobalConfigDictParserConfig",
    "RollgymCompatWarning",
    "RolloutCollectionHelper",
    "RunHelper",
    "shim_path",
]

POLL_INTERVAL = 60.0
"""``run_forever`` polls this often."""


class BaseServerConfig(BaseModel):
    """Where a server listens (``server_utils.BaseServerConfig``)."""

    host: str
    port: int
    num_workers: int | None = None


class GlobalConfigDictParserConfig(BaseModel):
    """The parse options for ``RunHelper.start``. ``initial_global_config_dict``: the global
    config (an omegaconf ``DictConfig`` or any mapping), over the yaml at ``dotenv_path``
    (``env.yaml`` in the working directory by default). rollgym reads no command line, so
    ``skip_load_from_cli=False`` only warns; secrets are never served (``hide_secrets``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    dotenv_path: Path | None = None
    initial_global_config_dict: Any = None
    skip_load_from_cli: bool = False
    skip_load_from_dotenv: bool = False
    hide_secrets: bool = False
    offline: bool = False


_STARTED: list[RunHelper] = []
"""The helpers started in this process, newest last: ``run_examples`` without a
``head_server_config`` asks the newest's head server."""


class RunHelper:
    """Starts, watches and stops the servers of a NeMo RL run."""

    def __init__(self) -> None:
        self._stack: RunningStack | None = None

    def start(self, global_config_dict_parser_config: GlobalConfigDictParserConfig) -> None:
        """Start every server and the head server and wait until all answer; on any failure
        everything started is stopped and the error raised (``ConfigError`` for a config
        mistake, before anything starts; ``LaunchError`` for a server that never came up)."""
        if self._stack is not None:
            raise RuntimeError("RunHelper is started already: shutdown() first")
        parse = global_config_dict_parser_config
        if parse.offline:
            warnings.warn("offline=True: RunHelper.start starts servers anyway",
                          RollgymCompatWarning, stacklevel=2)  # fmt: skip
        settings = global_config(
            parse.initial_global_config_dict,
            parse.dotenv_path,
            skip_dotenv=parse.skip_load_from_dotenv,
            skip_cli=parse.skip_load_from_cli,
        )
        stack = RunningStack(make_plan(settings))
        stack.start()
        self._stack = stack
        _STARTED.append(self)

    @property
    def head_server_config(self) -> BaseServerConfig:
        """Where this helper's head server listens."""
        plan = self._running().plan
        # A wildcard (NeMo RL's 0.0.0.0) is where it listens, not where to call it.
        host = "127.0.0.1" if plan.head_host in WILDCARD else plan.head_host
        return BaseServerConfig(host=host, port=plan.head_port)

    def poll(self) -> None:
        """``RuntimeError`` if a server died and cannot be brought back (see the module)."""
        self._running().poll()

    def pids(self) -> dict[str, list[int]]:
        """The pids of each server's processes, by name (rollgym's addition: NeMo RL never asks)."""
        return self._stack.pids() if self._stack is not None else {}

    def shutdown(self) -> None:
        """Stop every process ``start`` started, and the head server; idempotent."""
        stack, self._stack = self._stack, None
        if self in _STARTED:
            _STARTED.remove(self)
        if stack is not None:
            stack.stop()

    def run_forever(self) -> None:
        """Poll every minute until interrupted (or a server is lost), then shut down."""
        try:
            while True:
                self.poll()
                time.sleep(POLL_INTERVAL)
        except KeyboardInterrupt:
            pass
        finally:
            self.shutdown()

    def _running(self) -> RunningStack:
        if self._stack is None:
            raise RuntimeError("RunHelper is not started (call start() first)")
        return self._stack


class RolloutCollectionHelper:
    """Rollout collection for NeMo RL: ``run_examples`` (see the module).

    ``on_failure``: ``"mask"`` (the default) resolves a failed rollout to a masked result;
    ``"raise"`` makes its awaitable raise the typed ``RollgymError`` instead (``status`` set for
    HTTP failures, which NeMo RL maps to its infrastructure / data failures and retries)."""

    def __init__(self, *, on_failure: OnFailure = "mask") -> None:
        if on_failure not in ("mask", "raise"):
            raise ValueError(f"on_failure must be 'mask' or 'raise', not {on_failure!r}")
        self.on_failure: OnFailure = on_failure
        self._pools = Pools()
        self._warned_tokens = False

    def run_examples(
        self,
        examples: list[dict[str, Any]],
        head_server_config: BaseServerConfig | None = None,
        semaphore: asyncio.Semaphore | None = None,
        route_failures_to_sidecar: bool = False,
        environment_server_name: str | None = None,
        *,
        max_resident_tasks: int | None = None,
        dispatch_budget_s: float | None = None,
        drain_margin_s: float | None = None,
        latency_tracker: Any = None,
    ) -> Iterator[Awaitable[tuple[dict[str, Any], dict[str, Any]]]]:
        """Run every row once; return an iterator of awaitables, the k-th resolving to the k-th
        rollout to finish as ``(row, result)``. Rows start in order when the iterator is first
        consumed, on the running event loop. Unknown agents fail here, before anything runs."""
        if max_resident_tasks is not None and max_resident_tasks < 1:
            raise ValueError("max_resident_tasks must be at least 1")
        head = head_server_config or _local_head()
        layout = Layout.fetch(head.host, head.port)
        rows = list(examples)
        agents = route_rows(rows, layout.config, environment_server_name)
        # Every row at once, unless a cap is asked for.
        caps = (len(rows), max_resident_tasks, layout.concurrency)
        concurrency = min((c for c in caps if c), default=1)
        return Batch(
            rows,
            agents,
            layout,
            self._pools.get(layout.connections),
            semaphore=semaphore,
            on_failure="mask" if route_failures_to_sidecar else self.on_failure,
            concurrency=concurrency,
            deadline=None if dispatch_budget_s is None else time.monotonic() + dispatch_budget_s,
            drain_margin_s=drain_margin_s,
            tracker=tracker_of(latency_tracker),
            warn_tokens=self._warn_no_tokens,
        )

    async def aclose(self) -> None:
        """Close the running loop's connection pool."""
        await self._pools.aclose()

    def _warn_no_tokens(self) -> None:
        if self._warned_tokens:
            return
        self._warned_tokens = True
        warnings.warn(
            "a rollout came back without token ids (prompt_token_ids, generation_token_ids, "
            "generation_log_probs): NeMo RL cannot train on it. Set return_token_ids: true on "
            "the policy model's openai_proxy in the rollgym config",
            RollgymCompatWarning,
            stacklevel=2,
        )


def _local_head() -> BaseServerConfig:
    if _STARTED:
        return _STARTED[-1].head_server_config
    return BaseServerConfig(host="127.0.0.1", port=DEFAULT_HEAD_SERVER_PORT)


def shim_path() -> Path:
    """The directory to put first on ``PYTHONPATH`` so that ``import nemo_gym`` is this module."""
    return Path(__file__).with_name("shim")
