"""A model server in front of an OpenAI-compatible upstream (vLLM, SGLang, OpenAI).

``POST /v1/responses`` translates Responses API requests to Chat Completions and back
(``rollgym.models.translate``); ``POST /v1/chat/completions`` passes through. Options::

    servers:
      model:
        kind: model
        impl: openai_proxy
        options:
          base_url: http://gpu-node:8000/v1
          api_key_env: VLLM_API_KEY     # the NAME of the variable holding the key (optional)
          model: Qwen/Qwen3-8B          # sent upstream instead of the request's model (optional)
          timeout: 300                  # seconds per attempt (optional)
          upstream_retry: {max_attempts: 3}   # RetryPolicy fields (optional)
          extra_body: {return_token_ids: true}  # merged into every upstream request (optional)

Calls to the upstream go through the shared ``HttpClient``, so retries, timeouts and error
translation are those of every other rollgym call; a failure after retries propagates as the
client's typed error, which the app answers 502/504 with the upstream's error as ``origin``.
The API key goes only to the upstream, and is scrubbed from any error that passes through.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from fastapi import FastAPI
from pydantic import SecretStr, ValidationError
from starlette.requests import Request
from starlette.routing import Route

from rollgym.config import Config, RetryPolicy, format_validation_error, kind_defaults
from rollgym.errors import ConfigError, InvalidRequest, ProtocolError, RollgymError
from rollgym.http import Target
from rollgym.models.translate import CHAT_ENDPOINT, chat_to_response, responses_to_chat
from rollgym.server.app import json_route, read_json
from rollgym.server.base import BaseServer, ServerContext

OPTIONS = ("base_url", "api_key_env", "model", "upstream_retry", "timeout", "extra_body")
_REDACTED = "REDACTED"
_MIN_SCRUB_LEN = 6  # a shorter "key" would blank out ordinary words in error messages

Handler = Callable[[Request], Awaitable[Any]]


class OpenAIProxy(BaseServer):
    """Responses API and Chat Completions in front of an OpenAI-compatible upstream."""

    kind: ClassVar[str] = "model"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        where = f"servers.{self.name}.options"
        base_url, model, extra_body, policy = _parse_options(self.options, where)
        self.model_override: str | None = model
        self.extra_body: dict[str, Any] = extra_body
        self.upstream = Target(f"{self.name}.upstream", (base_url.rstrip("/"),), policy)
        # A SecretStr: the key stays out of reprs, tracebacks with locals and state dumps.
        self._api_key = _api_key(self.options.get("api_key_env"), where)

    @classmethod
    def check_options(cls, config: Config, name: str) -> None:
        # The same checks as at start-up (the key's variable included), before anything starts.
        where = f"{config.source or 'config'}: servers.{name}.options"
        options = config.servers[name].options
        _parse_options(options, where)
        _api_key(options.get("api_key_env"), where)

    def add_routes(self, app: FastAPI) -> None:
        routes = (("/v1/responses", self._responses), ("/v1/chat/completions", self._chat))
        for path, handler in routes:
            app.router.routes.append(
                Route(path, json_route(self._scrubbed(handler)), methods=["POST"])
            )

    async def _responses(self, request: Request) -> Any:
        params = await _read_object(request)
        chat = responses_to_chat(params, model=self.model_override)
        completion = await self._call_upstream(chat)
        return chat_to_response(
            completion, params, upstream=self.upstream.name, model=chat.get("model")
        )

    async def _chat(self, request: Request) -> Any:
        body = await _read_object(request)
        if body.get("stream"):
            raise InvalidRequest(
                "streaming is not supported by the proxy; omit 'stream'", status=400
            )
        if self.model_override:
            body["model"] = self.model_override
        completion = await self._call_upstream(body)
        if not isinstance(completion, dict):
            raise ProtocolError(
                f"{self.upstream.name} answered {CHAT_ENDPOINT} with something other than "
                "a JSON object",
                server=self.upstream.name, endpoint=CHAT_ENDPOINT, method="POST",
            )  # fmt: skip
        return completion

    async def _call_upstream(self, payload: dict[str, Any]) -> Any:
        if self.extra_body:
            payload = {**self.extra_body, **payload}
        headers = None
        if self._api_key is not None:
            headers = {"Authorization": f"Bearer {self._api_key.get_secret_value()}"}
        return await self.client.call(self.upstream, CHAT_ENDPOINT, payload, headers=headers)

    def _scrubbed(self, handler: Handler) -> Handler:
        """``handler`` with the API key removed from any error it raises.

        The shared redaction masks ``Bearer ...`` and ``sk-...`` strings; an upstream may also
        echo the bare key (e.g. "invalid key abc123"), which only this server knows to look for.
        """

        async def run(request: Request) -> Any:
            try:
                return await handler(request)
            except RollgymError as err:
                # ``from None``: the original, unscrubbed error must not ride along as a cause.
                raise self._scrub(err) from None

        return run

    def _scrub(self, err: RollgymError) -> RollgymError:
        key = self._api_key.get_secret_value() if self._api_key is not None else ""
        if len(key) < _MIN_SCRUB_LEN:
            return err
        changes: dict[str, Any] = {
            name: value.replace(key, _REDACTED)
            for name in ("message", "body", "url")
            if isinstance(value := getattr(err, name), str) and key in value
        }
        if err.origin is not None:
            origin = self._scrub(err.origin)
            if origin is not err.origin:
                changes["origin"] = origin
        return err.with_fields(**changes) if changes else err


async def _read_object(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", status=422)
    return body


def _parse_options(
    options: dict[str, Any], where: str
) -> tuple[str, str | None, dict[str, Any], RetryPolicy]:
    """(base_url, model override, extra_body, upstream policy); ``ConfigError`` naming the key."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown option(s) {', '.join(unknown)} (known: {', '.join(OPTIONS)})"
        )
    base_url = options.get("base_url")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"{where}.base_url: the upstream's URL is required, e.g. http://host:8000/v1"
        )
    model = options.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{where}.model must be a string")
    extra_body = options.get("extra_body") or {}
    if not isinstance(extra_body, dict):
        raise ConfigError(f"{where}.extra_body must be a mapping")
    return base_url, model, extra_body, _upstream_policy(options, where)


def _upstream_policy(options: dict[str, Any], where: str) -> RetryPolicy:
    overrides = options.get("upstream_retry") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where}.upstream_retry must be a mapping of retry policy fields")
    data = {**kind_defaults("model"), **overrides}
    timeout = options.get("timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"{where}.timeout must be a positive number of seconds")
        data["attempt_timeout"] = timeout
    try:
        return RetryPolicy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(f"{where}.upstream_retry", exc)) from None


def _api_key(env_name: Any, where: str) -> SecretStr | None:
    if env_name is None:
        return None
    if not isinstance(env_name, str) or not env_name:
        raise ConfigError(f"{where}.api_key_env must name an environment variable")
    key = os.environ.get(env_name)
    if not key:
        # Name the variable, never a value.
        raise ConfigError(f"{where}.api_key_env: environment variable {env_name} is not set")
    return SecretStr(key)
