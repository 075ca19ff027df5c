"""Telling rollgym's model servers that the weights changed: ``push(path, version)``.

A trainer saves its policy (``model.save_pretrained(path)``: safetensors, same architecture)
and pushes it to every inference server before the next collection step::

    from rollgym.integrations.weights import LocalModelWeights, VllmWeights

    sync = LocalModelWeights("http://127.0.0.1:8001")      # rollgym serve-model
    # sync = VllmWeights("http://gpu-node:8000")            # vLLM with VLLM_SERVER_DEV_MODE=1
    model.save_pretrained(f"ckpt/step-{step}")
    sync.push_sync(f"ckpt/step-{step}", version=step)     # or: await sync.push(...)
    assert sync.version == step                            # the last version a server confirmed

Each push is bounded: every request has ``timeout`` seconds and the push ``deadline`` in all;
transient failures (connection refused or reset, timeouts, 502/503/504) are retried up to
``attempts`` times with backoff, a 4xx never. Failures are rollgym's typed errors
(``HTTPStatusError`` with the server's status and body, ``ReadTimeout``, ``DeadlineExceeded``,
``ConnectError``...), plain values that pickle across a Ray actor boundary. Versions must
increase: a push whose version is not above the last confirmed one is refused before anything
is sent (``InvalidRequest``, status 409); the CPU backend checks it too (409).

- ``LocalModelWeights``: rollgym's CPU backend (``rollgym.models.local``), ``POST
  /rollgym/weights {"path", "version"}`` with the control token (``rollgym.control_token``:
  the user's own, found by itself; ``token=`` for another). The path must be under the
  backend's weights root (``--weights-root``; default: the directory holding its model). The
  backend swaps the weights between two
  generations, and each completion names the version it ran under (``rollgym_policy_version``).
  Re-pushing the version and path being served is a no-op, so a retried push that had landed
  is not refused as stale.
- ``VllmWeights``: a running vLLM 0.32 OpenAI server started with ``VLLM_SERVER_DEV_MODE=1``
  (which enables its development endpoints; keep such a server off untrusted networks). vLLM
  has no rollgym endpoint, so a push is four of its own calls, read from vLLM 0.32's source:

    1. ``POST /pause?mode=wait``: let running requests finish and hold new ones (with the
       default ``clear_cache=true`` it drops the prefix cache, whose KV the old weights made);
    2. ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": PATH}}``:
       every worker reloads the checkpoint at ``PATH`` from disk, in place (vLLM's
       ``reload_weights(weights_path=...)``; it also points the model config at ``PATH``);
    3. ``POST /update_weight_version {"new_version": "N"}``: vLLM records the version
       (``GET /weight_info`` answers it);
    4. ``POST /resume``, also when 2 or 3 failed, so a failed push never leaves vLLM paused.

  Chosen over vLLM's ``/init_weight_transfer_engine`` + ``/update_weights`` (NCCL or shared-
  memory transfer of tensors from a trainer process: faster, but it needs the trainer in the
  same process group) and over ``/sleep`` + ``/wake_up`` (frees GPU memory, reloads nothing):
  a path on a shared disk is what a trainer in another process or on another machine has.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from rollgym.config import RetryPolicy
from rollgym.control_token import authorization, control_token
from rollgym.errors import InvalidRequest, ProtocolError, RollgymError
from rollgym.http import HttpClient, Target
from rollgym.models.local import WEIGHTS_ENDPOINT
from rollgym.wire import POLICY_VERSION

__all__ = ["LocalModelWeights", "VllmWeights", "WeightPush", "WeightSync"]

T = TypeVar("T")

PUSH_TIMEOUT = 600.0
"""Seconds one request of a push may take by default (vLLM reloading a large model)."""
PUSH_ATTEMPTS = 3


@dataclass(frozen=True)
class WeightPush:
    """A push a server confirmed."""

    server: str
    path: str
    version: int
    previous: int | None
    """The version served before (as the server said, or the last one pushed from here)."""
    seconds: float


@runtime_checkable
class WeightSync(Protocol):
    """A model server that can be told to load new weights."""

    @property
    def version(self) -> int | None:
        """The last version a server confirmed (None before the first push)."""
        ...

    async def push(self, path: str | Path, version: int) -> WeightPush: ...

    def push_sync(self, path: str | Path, version: int) -> WeightPush: ...


class _Weights:
    """What both kinds share: the policy, the version check, the sync wrapper."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        timeout: float = PUSH_TIMEOUT,
        attempts: int = PUSH_ATTEMPTS,
        deadline: float | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidRequest(f"{url!r}: the server's URL, e.g. http://127.0.0.1:8000")
        policy = RetryPolicy.model_validate(
            {
                "max_attempts": attempts,
                "attempt_timeout": timeout,
                "deadline": deadline if deadline is not None else timeout * attempts + 30,
                # Every step of a push can be replayed: loading a path again is harmless.
                "idempotent": True,
                "backoff_initial": 0.5,
                "backoff_max": 5.0,
                # A push is a rare control call: no budget or breaker shared with anything.
                "budget": {"enabled": False},
                "breaker": {"enabled": False},
            }
        )
        self.url = url.rstrip("/")
        self.target = Target.single(name, self.url, policy)
        self._version: int | None = None
        self._lock: asyncio.Lock | None = None
        # push_sync runs each push on an event loop of its own: an asyncio lock cannot order
        # pushes from two threads, this one does.
        self._sync_lock = threading.Lock()

    @property
    def version(self) -> int | None:
        return self._version

    async def push(self, path: str | Path, version: int) -> WeightPush:
        """Make the server serve the weights at ``path`` as ``version``; return once it has."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidRequest(f"version must be a non-negative integer, not {version!r}")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # pushes from one trainer go in order
            if self._version is not None and version <= self._version:
                raise InvalidRequest(
                    f"stale weights: version {version} is not above {self._version}, the last "
                    f"one {self.target.name} confirmed; versions must increase",
                    status=409,
                    server=self.target.name,
                )
            started = time.monotonic()
            client = HttpClient(limit=4)
            try:
                previous = await self._send(client, str(path), version)
            finally:
                await client.close()
            self._version = version
            return WeightPush(
                self.target.name, str(path), version, previous, time.monotonic() - started
            )

    def push_sync(self, path: str | Path, version: int) -> WeightPush:
        """``push`` for synchronous code (a trainer's step callback). Pushes from several
        threads go in order. Called on a thread whose event loop is running it is a
        ``RuntimeError``: it would stall that loop for up to the push's deadline (await
        ``push`` there instead)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "push_sync() called from a running event loop: await push() instead "
                "(blocking here would stall the loop for up to the push's deadline)"
            )
        with self._sync_lock:
            self._lock = None  # each asyncio.run is a new loop: no lock of an earlier one
            return asyncio.run(self.push(path, version))

    async def _send(self, client: HttpClient, path: str, version: int) -> int | None:
        raise NotImplementedError


class LocalModelWeights(_Weights):
    """rollgym's CPU backend (``rollgym serve-model``) at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 120.0,
        attempts: int = PUSH_ATTEMPTS,
        deadline: float | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(
            url, name="local_model", timeout=timeout, attempts=attempts, deadline=deadline
        )
        self._token = token
        """The control token (None: this user's, read at the first push)."""

    async def _send(self, client: HttpClient, path: str, version: int) -> int | None:
        token = self._token or control_token()
        answer = await client.call(
            self.target, WEIGHTS_ENDPOINT, {"path": path, "version": version},
            headers=authorization(token),
        )  # fmt: skip
        if answer.get(POLICY_VERSION) != version:
            raise ProtocolError(
                f"{WEIGHTS_ENDPOINT} answered {answer.get(POLICY_VERSION)!r} as the version "
                f"served, not {version}",
                server=self.target.name, endpoint=WEIGHTS_ENDPOINT, body=str(answer),
            )  # fmt: skip
        previous = answer.get("previous_version")
        return previous if isinstance(previous, int) else None


class VllmWeights(_Weights):
    """A vLLM 0.32 OpenAI server at ``url`` (its root, without ``/v1``), started with
    ``VLLM_SERVER_DEV_MODE=1``."""

    PAUSE = "/pause?mode=wait"
    RPC = "/collective_rpc"
    VERSION = "/update_weight_version"
    RESUME = "/resume"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = PUSH_TIMEOUT,
        attempts: int = PUSH_ATTEMPTS,
        deadline: float | None = None,
    ) -> None:
        super().__init__(
            url.removesuffix("/").removesuffix("/v1"),
            name="vllm",
            timeout=timeout,
            attempts=attempts,
            deadline=deadline,
        )

    async def _send(self, client: HttpClient, path: str, version: int) -> int | None:
        target = self.target
        failure: BaseException | None = None
        try:
            # Inside the try: a pause that timed out on our side may still take effect on
            # vLLM's (it waits for in-flight requests), so /resume is sent whatever it answered.
            await client.call_json(target, self.PAUSE, {})
            # vLLM passes only strings as RPC arguments ("for security reason").
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": path}}
            await client.call_json(target, self.RPC, rpc)
            await client.call_json(target, self.VERSION, {"new_version": str(version)})
        except BaseException as exc:
            failure = exc
            raise
        finally:
            try:
                await client.call_json(target, self.RESUME, {})
            except RollgymError:
                if failure is None:
                    raise
                # The push's own failure is the one to report; a resume that failed too
                # leaves vLLM paused, which the next push (or a /resume) undoes.
        return self._version
