"""A model server in front of an OpenAI-compatible upstream (vLLM, SGLang, OpenAI).

``POST /v1/responses`` translates Responses API requests to Chat Completions and back
(``rollgym.models.translate``); ``POST /v1/chat/completions`` passes through, and so does vLLM's
``POST /tokenize`` (to the upstream's root: ``base_url`` without its ``/v1``, where vLLM serves
it and NeMo Gym's vLLM client looks for it). ``GET /v1/models`` lists the ``model`` option
(without it the proxy cannot say which model the upstream serves, and answers 501). Options::

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
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, Field, SecretStr, field_validator
from starlette.routing import BaseRoute, Route

from rollgym.config import RetryPolicy, kind_defaults
from rollgym.errors import HTTPStatusError, InvalidRequest, ProtocolError, RollgymError
from rollgym.http import Target
from rollgym.models.translate import CHAT_ENDPOINT, chat_to_response, responses_to_chat
from rollgym.server.base import ServerContext
from rollgym.server.endpoint import Call, json_endpoint
from rollgym.server.model import (
    MODELS_ENDPOINT,
    TOKENIZE_ENDPOINT,
    ModelServer,
    json_object,
    model_list,
)

_REDACTED = "REDACTED"
_MIN_SCRUB_LEN = 6  # a shorter "key" would blank out ordinary words in error messages

T = TypeVar("T")


def _http_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError("the upstream's URL is required, e.g. http://host:8000/v1")
    return url.rstrip("/")


def _model_policy() -> RetryPolicy:
    return RetryPolicy.model_validate(kind_defaults("model"))


class OpenAIProxy(ModelServer):
    """Responses API and Chat Completions in front of an OpenAI-compatible upstream."""

    class Options(ModelServer.Options):
        base_url: Annotated[str, AfterValidator(_http_url)]
        api_key_env: str | None = Field(default=None, description="the NAME of the variable")
        model: str | None = Field(default=None, description="sent instead of the request's")
        timeout: float | None = Field(default=None, gt=0, description="seconds per attempt")
        upstream_retry: RetryPolicy = Field(default_factory=_model_policy)
        extra_body: dict[str, Any] = Field(default_factory=dict)

        @field_validator("upstream_retry", mode="before")
        @classmethod
        def _model_defaults(cls, value: Any) -> Any:
            # Fields given override a model server's retry defaults, not the generic ones.
            if value is None:  # ``upstream_retry:`` left empty in YAML
                value = {}
            return {**kind_defaults("model"), **value} if isinstance(value, dict) else value

        @field_validator("api_key_env")
        @classmethod
        def _key_is_set(cls, name: str | None) -> str | None:
            if name is not None and not os.environ.get(name):
                # Name the variable, never a value.
                raise ValueError(f"environment variable {name or '(empty name)'} is not set")
            return name

    options: Options

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        opts = self.options
        policy = opts.upstream_retry
        if opts.timeout is not None:
            policy = policy.model_copy(update={"attempt_timeout": opts.timeout})
        self.upstream = Target(f"{self.name}.upstream", (opts.base_url,), policy)
        root = opts.base_url.removesuffix("/v1")
        # Another name for another URL: the client keeps its breaker and stats per name.
        self.upstream_root = (
            self.upstream
            if root == opts.base_url
            else Target(f"{self.name}.upstream_root", (root,), policy)
        )
        # A SecretStr: the key stays out of reprs, tracebacks with locals and state dumps.
        self._api_key = (
            SecretStr(os.environ[opts.api_key_env]) if opts.api_key_env is not None else None
        )

    def routes(self) -> list[BaseRoute]:
        chat = Route("/v1/chat/completions", json_endpoint(self._chat), methods=["POST"])
        models = Route(MODELS_ENDPOINT, json_endpoint(self._models), methods=["GET"])
        tokenize = Route(TOKENIZE_ENDPOINT, json_endpoint(self._tokenize), methods=["POST"])
        return [*super().routes(), chat, models, tokenize]

    async def _models(self, body: Any, call: Call) -> Any:
        if self.options.model is None:
            # Listing the upstream's models needs a GET, which rollgym's client does not
            # send; an empty or made-up list would mislead whoever picks a model from it.
            raise HTTPStatusError(
                f"{MODELS_ENDPOINT}: set servers.{self.name}.options.model to list the model "
                "this proxy serves",
                status=501, server=self.name, endpoint=MODELS_ENDPOINT, method="GET",
            )  # fmt: skip
        return model_list(self.options.model, owned_by=self.upstream.name)

    async def _tokenize(self, raw: Any, call: Call) -> Any:
        body = json_object(raw)
        if self.options.model:
            body["model"] = self.options.model  # the upstream's name for it, as in chat calls
        headers = self._auth()
        return await self._scrubbed(
            self.client.call(self.upstream_root, TOKENIZE_ENDPOINT, body, headers=headers)
        )

    async def respond(self, params: dict[str, Any], call: Call) -> dict[str, Any]:
        chat = responses_to_chat(params, model=self.options.model)
        completion = await self._scrubbed(self._call_upstream(chat))
        return chat_to_response(
            completion, params, upstream=self.upstream.name, model=chat.get("model")
        )

    async def _chat(self, raw: Any, call: Call) -> Any:
        body = json_object(raw)
        if body.get("stream"):
            raise InvalidRequest(
                "streaming is not supported by the proxy; omit 'stream'", status=400
            )
        if self.options.model:
            body["model"] = self.options.model
        completion = await self._scrubbed(self._call_upstream(body))
        if not isinstance(completion, dict):
            raise ProtocolError(
                f"{self.upstream.name} answered {CHAT_ENDPOINT} with something other than "
                "a JSON object",
                server=self.upstream.name, endpoint=CHAT_ENDPOINT, method="POST",
            )  # fmt: skip
        return completion

    async def _call_upstream(self, payload: dict[str, Any]) -> Any:
        if self.options.extra_body:
            payload = {**self.options.extra_body, **payload}
        return await self.client.call(self.upstream, CHAT_ENDPOINT, payload, headers=self._auth())

    def _auth(self) -> dict[str, str] | None:
        if self._api_key is None:
            return None
        return {"Authorization": f"Bearer {self._api_key.get_secret_value()}"}

    async def _scrubbed(self, work: Awaitable[T]) -> T:
        """``work``'s result, with the API key removed from any error it raises.

        The shared redaction masks ``Bearer ...`` and ``sk-...`` strings; an upstream may also
        echo the bare key (e.g. "invalid key abc123"), which only this server knows to look for.
        """
        try:
            return await work
        except RollgymError as err:
            # ``from None``: the original, unscrubbed error must not ride along as a cause.
            raise self._scrub(err) from None

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
