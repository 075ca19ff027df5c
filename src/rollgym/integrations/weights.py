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
  has no rollgym endpoint, so a push is its own calls, read from vLLM 0.32's source
  (``entrypoints/rl/online/api_router.py``, ``serve/dev/rpc/api_router.py``):

    0. before anything is sent: the path is made absolute (vLLM reads a relative one as a hub
       repo id) and must be a checkpoint directory (``config.json``, ``*.safetensors``) whose
       tensors have the served checkpoint's names, shapes and dtypes (``integrations.
       checkpoint``: the safetensors headers only; the served one is the last pushed, else
       ``GET /v1/models``'s ``root``, else ``served=``); else ``BadCheckpoint``. vLLM 0.32
       loads a mismatch half-way and can then reload nothing: its next request kills it;
    1. ``GET /weight_info`` (the version served before), and with ``model_servers``, a
       ``/rollgym/pause`` of those proxies (their calls wait there);
    2. ``POST /pause?mode=wait``: let running requests finish and hold new ones;
    3. ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": PATH}}``
       and ``POST /update_weight_version {"new_version": "N"}``; if either fails, the previous
       checkpoint is reloaded (on a fresh connection: vLLM drops the one it answered 500 on),
       and the push's own error is raised; if that fails too, ``WeightsNotRestored``;
    4. ``POST /resume``, also when 2 or 3 failed, on a fresh connection each try until vLLM
       acknowledges it (for ``resume_within`` seconds, whatever ``attempts`` says; then
       ``WeightsNotRestored``);
    5. ``GET /weight_info`` must say N; the proxies are resumed at N (``/rollgym/resume``), so
       every later call records N as its ``rollgym_policy_version`` (after a failed push they
       are released at the version they ran).

  Chosen over vLLM's ``/init_weight_transfer_engine`` + ``/update_weights`` (NCCL or shared-
  memory transfer of tensors from a trainer process: faster, but it needs the trainer in the
  same process group) and over ``/sleep`` + ``/wake_up`` (frees GPU memory, reloads nothing):
  a path on a shared disk is what a trainer in another process or on another machine has.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import aiohttp
import orjson

from rollgym.config import RetryPolicy
from rollgym.control_token import authorization, control_token
from rollgym.errors import (
    HTTPStatusError,
    InvalidRequest,
    ProtocolError,
    RollgymError,
    WeightsNotRestored,
)
from rollgym.http import HttpClient, Target
from rollgym.http.translate import translate
from rollgym.integrations.checkpoint import check_matches, checkpoint_dir
from rollgym.models.local import WEIGHTS_ENDPOINT
from rollgym.trainer.policy_control import PolicyControl
from rollgym.wire import POLICY_VERSION

__all__ = ["LocalModelWeights", "VllmWeights", "WeightPush", "WeightSync"]

T = TypeVar("T")

PUSH_TIMEOUT = 600.0
"""Seconds one request of a push may take by default (vLLM reloading a large model)."""
PUSH_ATTEMPTS = 3
RESUME_WITHIN = 60.0
"""Seconds a vLLM ``/resume`` is retried until acknowledged, whatever ``attempts`` says."""
RESUME_TIMEOUT = 30.0
"""Seconds one ``/resume`` (or a GET of vLLM's state) may take."""

log = logging.getLogger("rollgym.integrations.weights")

_unnamed_warned = False
"""Whether a ``VllmWeights`` without ``model_servers`` was warned about (once a process)."""


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
            sent = self._prepare(path)
            client = HttpClient(limit=4)
            try:
                previous = await self._send(client, sent, version)
            finally:
                await client.close()
            self._version = version
            return WeightPush(self.target.name, sent, version, previous, time.monotonic() - started)

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

    def _prepare(self, path: str | Path) -> str:
        """The path to send (checked here, before anything is sent)."""
        return str(path)

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


def _warn_unnamed(url: str) -> None:
    # vLLM's completions carry no version, so the proxy records the one it was told: none.
    global _unnamed_warned
    if _unnamed_warned:
        return
    _unnamed_warned = True
    log.warning(
        "VllmWeights(%r) names no model_servers: the rollgym model servers in front of this "
        "vLLM are not told the versions pushed, so their records keep the version they had "
        "(policy version 0). Pass model_servers=[...] with each openai_proxy's URL",
        url,
    )


class VllmWeights(_Weights):
    """A vLLM 0.32 OpenAI server at ``url`` (its root, without ``/v1``), started with
    ``VLLM_SERVER_DEV_MODE=1``. ``model_servers``: the rollgym model servers (``openai_proxy``)
    in front of it, told each pushed version (their calls record it). ``served``: the
    checkpoint directory vLLM serves, where its ``/v1/models`` ``root`` is no local path (a hub
    id, or a path on another machine). ``check_dtypes``: refuse a checkpoint whose tensors'
    dtypes differ from the served ones (vLLM would cast them). ``resume_within``: how long a
    ``/resume`` is retried, on a fresh connection each time, until vLLM acknowledges it."""

    PAUSE = "/pause?mode=wait"
    RPC = "/collective_rpc"
    VERSION = "/update_weight_version"
    RESUME = "/resume"
    WEIGHT_INFO = "/weight_info"
    MODELS = "/v1/models"

    def __init__(
        self,
        url: str,
        *,
        model_servers: str | Sequence[str] = (),
        served: str | Path | None = None,
        check_dtypes: bool = True,
        timeout: float = PUSH_TIMEOUT,
        attempts: int = PUSH_ATTEMPTS,
        deadline: float | None = None,
        resume_within: float = RESUME_WITHIN,
        token: str | None = None,
    ) -> None:
        super().__init__(
            url.removesuffix("/").removesuffix("/v1"),
            name="vllm",
            timeout=timeout,
            attempts=attempts,
            deadline=deadline,
        )
        if resume_within <= 0:
            raise InvalidRequest("resume_within must be a positive number of seconds")
        servers = (model_servers,) if isinstance(model_servers, str) else tuple(model_servers)
        self.model_servers = servers
        if not servers:
            _warn_unnamed(self.url)
        self.check_dtypes = check_dtypes
        self.resume_within = resume_within
        self._served = None if served is None else str(Path(served).expanduser().resolve())
        """The checkpoint vLLM serves as vLLM names it (None: ask its ``/v1/models``)."""
        self._token = token
        # One attempt per connection: _resume makes a fresh one for each try.
        once = self.target.policy.model_copy(
            update={"max_attempts": 1, "attempt_timeout": min(timeout, RESUME_TIMEOUT),
                    "deadline": min(timeout, RESUME_TIMEOUT)}
        )  # fmt: skip
        self._resume_target = Target.single("vllm", self.url, once)
        # A reload that vLLM answered 500 failed in its workers (a bad file, a full disk):
        # sent again it fails again, after as long; the restore is what follows it.
        no_replay = self.target.policy.model_copy(update={"idempotent": False})
        self._rpc_target = Target.single("vllm", self.url, no_replay)

    @property
    def served(self) -> str | None:
        """The checkpoint vLLM serves, as far as this object knows (the last one it pushed)."""
        return self._served

    def _prepare(self, path: str | Path) -> str:
        # Absolute: vLLM reads a relative path as a hub repo id, or from its own directory.
        return str(checkpoint_dir(path))

    async def _send(self, client: HttpClient, path: str, version: int) -> int | None:
        served = self._served or await self._model_root()
        # Headers only, a few kilobytes, but off the loop all the same (a network disk).
        checked = await asyncio.to_thread(_check_against, path, served, self.check_dtypes)
        if not checked:
            log.warning(
                "vllm at %s serves %r, which is no checkpoint directory here: %s is pushed "
                "unchecked against it (pass served= to check it)", self.url, served, path,
            )  # fmt: skip
        previous = _int_version((await self._get(self.WEIGHT_INFO)).get("weight_version"))
        control = None
        if self.model_servers:
            control = PolicyControl(self.model_servers, token=self._token)
        try:
            if control is not None:
                # Hold the calls at the proxies while vLLM swaps, so every call that runs
                # after it is recorded under the new version (and none under the old one
                # runs on the new weights).
                await control.pause(abort=False, timeout_s=self.target.policy.deadline)
            try:
                await self._swap(client, path, version, served)
            except BaseException:
                if control is not None:
                    await control.release()  # at the version they ran: nothing changed
                raise
            if control is not None:
                await control.resume(version)
        finally:
            if control is not None:
                await control.aclose()
        self._served = path
        return previous if previous is not None else self._version

    async def _swap(self, client: HttpClient, path: str, version: int, served: str | None) -> None:
        """Pause, reload, set the version, resume (always), and read the version back."""
        target = self.target
        failure: BaseException | None = None
        try:
            # Inside the try: a pause that timed out on our side may still take effect on
            # vLLM's (it waits for in-flight requests), so /resume is sent whatever it answered.
            await client.call_json(target, self.PAUSE, {})
            try:
                # vLLM passes only strings as RPC arguments ("for security reason").
                await client.call_json(self._rpc_target, self.RPC, _reload(path))
                await client.call_json(target, self.VERSION, {"new_version": str(version)})
            except RollgymError as exc:
                # A failed reload leaves vLLM 0.32's engine half-loaded: its next request
                # kills the server. Reloading what it served before repairs it.
                await self._restore(served, exc)
                raise
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await self._resume(failure)
        told = (await self._get(self.WEIGHT_INFO)).get("weight_version")
        if told != str(version):
            raise ProtocolError(
                f"vllm's {self.WEIGHT_INFO} says weight_version {told!r} after the push of "
                f"version {version}",
                server=target.name, endpoint=self.WEIGHT_INFO,
            )  # fmt: skip

    async def _restore(self, served: str | None, failure: RollgymError) -> None:
        if served is None:
            raise WeightsNotRestored(
                f"the push failed ({failure.type}: {failure.message}) and vllm at {self.url} "
                "cannot be brought back: the checkpoint it served is unknown (pass served=); "
                "its engine may be broken: restart it",
                server=self.target.name, endpoint=self.RPC, origin=failure,
            ) from failure  # fmt: skip
        # On a fresh connection: vLLM 0.32 closes the one whose reload it answered 500.
        fresh = HttpClient(limit=1)
        try:
            await fresh.call_json(self._rpc_target, self.RPC, _reload(served))
        except RollgymError as exc:
            raise WeightsNotRestored(
                f"the push failed ({failure.type}: {failure.message}), and reloading the "
                f"previous checkpoint {served} failed too ({exc.type}: {exc.message}): vllm at "
                f"{self.url} may have a broken engine: restart it on {served}",
                server=self.target.name, endpoint=self.RPC, origin=failure,
            ) from failure  # fmt: skip
        finally:
            await fresh.close()
        log.warning(
            "vllm at %s: the push failed (%s: %s); it serves its previous weights (%s) again",
            self.url, failure.type, failure.message, served,
        )  # fmt: skip

    async def _resume(self, failure: BaseException | None) -> None:
        """``POST /resume`` until vLLM acknowledges it, each try on a fresh connection (vLLM
        may close one an earlier call used), for at most ``resume_within`` seconds."""
        ends = time.monotonic() + self.resume_within
        delay = 0.2
        while True:
            fresh = HttpClient(limit=1)
            try:
                await fresh.call_json(self._resume_target, self.RESUME, {})
                return
            except HTTPStatusError as exc:
                if exc.status is not None and exc.status < 500:
                    # No such endpoint (no dev mode), so nothing was paused either.
                    if failure is None:
                        raise
                    return
                last: RollgymError = exc
            except RollgymError as exc:
                last = exc
            finally:
                await fresh.close()
            if time.monotonic() + delay > ends:
                raise WeightsNotRestored(
                    f"vllm at {self.url} did not acknowledge POST {self.RESUME} within "
                    f"{self.resume_within:g}s ({last.type}: {last.message}): it may still hold "
                    "every request; POST /resume to it, or restart it",
                    server=self.target.name, endpoint=self.RESUME,
                    origin=failure if isinstance(failure, RollgymError) else last,
                ) from last  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _model_root(self) -> str | None:
        """The ``root`` of the model vLLM serves (the path it was started with)."""
        models = (await self._get(self.MODELS)).get("data")
        if isinstance(models, list) and models and isinstance(models[0], dict):
            root = models[0].get("root")
            return root if isinstance(root, str) and root else None
        return None

    async def _get(self, endpoint: str) -> dict[str, Any]:
        """GET ``endpoint`` of vLLM (rollgym's client sends POSTs only): its JSON object."""
        url = self.url + endpoint
        limit = min(self.target.policy.attempt_timeout, RESUME_TIMEOUT)
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit)) as http,
                http.get(url) as answer,
            ):
                status, raw = answer.status, await answer.read()
        except Exception as exc:
            raise translate(
                exc, server=self.target.name, method="GET", url=url, endpoint=endpoint,
                timeout=limit,
            ) from exc  # fmt: skip
        if status != 200:
            raise HTTPStatusError(
                f"vllm answered GET {endpoint} with {status} (is it started with "
                "VLLM_SERVER_DEV_MODE=1?)",
                status=status, body=raw, server=self.target.name, url=url, endpoint=endpoint,
                method="GET",
            )  # fmt: skip
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            raise ProtocolError(
                f"vllm's GET {endpoint} is not a JSON object",
                body=raw, server=self.target.name, url=url, endpoint=endpoint, method="GET",
            )  # fmt: skip
        return data


def _check_against(path: str, served: str | None, dtypes: bool) -> bool:
    """Check the checkpoint at ``path`` against the served one; False if that one is no
    checkpoint directory here."""
    if served is None or not Path(served).is_dir():
        return False
    check_matches(Path(path), Path(served), dtypes=dtypes)
    return True


def _reload(path: str) -> dict[str, Any]:
    return {"method": "reload_weights", "kwargs": {"weights_path": path}}


def _int_version(value: object) -> int | None:
    """vLLM's ``weight_version`` as a rollgym version ("default" before any push: None)."""
    if isinstance(value, str) and value.isdigit() and value.isascii() and len(value) <= 18:
        return int(value)
    return None
