"""The CPU backend's engine: a local model directory, its chat template, one generation loop.

Not thread-safe by design: the server runs every generation and every weight swap on one
worker thread (``rollgym.models.local``), so a swap always falls between two generations and a
generation runs under one set of weights from its first token to its last. Rendering and
tokenizing (the Rust tokenizer) may run on other threads.

**The logprobs.** Each sampled token's logprob is of ``log_softmax(logits / temperature)`` over
the whole vocabulary: the distribution TRL 1.16's ``GRPOTrainer`` computes for the same tokens
(``selective_log_softmax(logits / self.temperature)``) and compares with the sampling logprobs
in its importance-sampling correction, so with the same weights and temperature the ratio is
1 up to float error. ``top_p`` / ``top_k`` restrict which tokens can be sampled but do not
renormalise the reported logprob (TRL does not apply them either; vLLM's
``--logprobs-mode processed_logprobs`` would). At ``temperature`` 0 (greedy) the logprobs are
of the unscaled distribution (``log_softmax(logits)``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollgym.errors import ConfigError, DeadlineExceeded, InvalidRequest, WaitedTooLong
from rollgym.extras import missing_hint
from rollgym.models.local_request import ChatRequest, Sampling
from rollgym.models.local_weights import copy_weights, read_weights

if TYPE_CHECKING:
    import torch


class Abandoned(Exception):
    """The caller went away: the generation stops at its next token."""


@dataclass(frozen=True)
class Generation:
    """One generation's tokens and what they say."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    """Per generated token, its ``top_logprobs`` alternatives (id, logprob), best first."""
    text: str
    finish_reason: str
    """``stop`` (end of turn or a stop string) or ``length`` (``max_tokens``)."""
    stop_reason: int | str | None
    policy_version: int
    seconds: float


@dataclass(eq=False)  # compared and hashed by identity: the server keeps a set of jobs
class Job:
    """What the worker thread needs to run one generation, and how to stop it."""

    prompt_ids: list[int]
    sampling: Sampling
    top_logprobs: int
    deadline: float
    """``time.monotonic()`` after which the generation fails (waiting included)."""
    abandoned: threading.Event = field(default_factory=threading.Event)


class LocalEngine:
    """A causal LM and its tokenizer loaded from ``model_dir`` (transformers, torch CPU)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_model_len: int | None = None,
        policy_version: int = 0,
        threads: int | None = None,
    ) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ConfigError(
                f"the CPU model backend needs torch and transformers ({exc}): {missing_hint(exc)}"
            ) from None

        if threads is not None:
            torch.set_num_threads(threads)
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequest(f"{model_dir}: the tokenizer has no chat template", status=400)
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir))
        self.model.eval()  # type: ignore[no-untyped-call]
        config = self.model.config
        limit = getattr(config, "max_position_embeddings", None) or 2048
        self.max_model_len = min(max_model_len or limit, limit)
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.policy_version = policy_version
        self.weights_path: str | None = str(self.model_dir)
        self.generated_tokens = 0
        self.generation_seconds = 0.0

    # -- prompts -------------------------------------------------------------------------------

    def render(self, request: ChatRequest, *, add_generation_prompt: bool = True) -> list[int]:
        """The prompt's ids: the chat template applied, then tokenized without added specials
        (the template writes them), as vLLM renders a chat prompt."""
        return self.render_messages(
            request.messages, request.tools, request.template_kwargs, add_generation_prompt
        )

    def render_messages(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any],
        add_generation_prompt: bool = True,
    ) -> list[int]:
        from jinja2 import TemplateError

        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,  # type: ignore[arg-type]
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
            )
        except TemplateError as exc:
            raise InvalidRequest(
                f"the chat template refused the messages: {exc}", status=400
            ) from None
        except TypeError as exc:  # a chat_template_kwargs key clashing with the template's own
            raise InvalidRequest(f"chat_template_kwargs: {exc}", status=400) from None
        except RecursionError:  # tools or messages nested past what the template can render
            raise InvalidRequest("the request is nested too deeply to render", status=400) from None
        return self.encode(str(text), add_special_tokens=False)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        return [int(i) for i in ids]

    def token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    # -- generation (the worker thread) --------------------------------------------------------

    def generate(self, job: Job) -> Generation:
        """Run ``job``: sample until end of turn, a stop string or ``max_tokens``."""
        import torch

        started = time.monotonic()
        if job.abandoned.is_set():
            raise Abandoned()
        if started > job.deadline:
            raise WaitedTooLong("the request's deadline ran out while it waited for the model")
        s = job.sampling
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "big") >> 1
        rng = torch.Generator().manual_seed(seed)
        ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] = []
        finish, stop_reason, text = "length", None, ""
        version = self.policy_version
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([job.prompt_ids]), use_cache=True)
            for _ in range(s.max_tokens):
                self._check(job)
                token, logprob, alternatives = _pick(out.logits[0, -1].float(), s, job, rng)
                ids.append(token)
                logprobs.append(logprob)
                top.append(alternatives)
                if token in self.eos_ids:
                    finish, stop_reason = "stop", None
                    break
                if s.stop:
                    text = self.decode(ids)
                    hit = _first_stop(text, s.stop)
                    if hit is not None:
                        finish, stop_reason, text = "stop", hit[1], text[: hit[0]]
                        break
                out = self.model(
                    input_ids=torch.tensor([[token]]),
                    cache=out.cache,  # transformers 5's name (past_key_values is deprecated)
                    use_cache=True,
                )
        if stop_reason is None:
            text = self.decode(ids)
        seconds = time.monotonic() - started
        self.generated_tokens += len(ids)
        self.generation_seconds += seconds
        return Generation(
            list(job.prompt_ids), ids, logprobs, top, text, finish, stop_reason, version, seconds
        )

    def _check(self, job: Job) -> None:
        if job.abandoned.is_set():
            raise Abandoned()
        if time.monotonic() > job.deadline:
            raise DeadlineExceeded("the request's deadline ran out during generation")

    # -- weights -------------------------------------------------------------------------------

    def read_weights(self, path: str, root: Path) -> dict[str, torch.Tensor]:
        """``path``'s tensors (a checkpoint under ``root``) checked against the model (any
        thread: nothing is changed)."""
        return read_weights(path, self.model.state_dict(), root)

    def swap_weights(self, loaded: dict[str, torch.Tensor], path: str, version: int) -> None:
        """Copy checked tensors in (the worker thread only: between generations)."""
        copy_weights(self.model.state_dict(), loaded)
        self.policy_version = version
        self.weights_path = path


SAMPLING_EPS = 1e-5
"""vLLM's ``_SAMPLING_EPS``: a temperature below it samples greedily."""


def _pick(
    logits: torch.Tensor, s: Sampling, job: Job, rng: torch.Generator
) -> tuple[int, float, list[tuple[int, float]]]:
    """One token, its logprob (see the module docstring) and its top alternatives."""
    import torch

    # Below vLLM's sampling epsilon, temperature is greedy (as in vLLM): logits / 1e-300 are
    # infinite and no distribution is left to sample from.
    if s.temperature < SAMPLING_EPS:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logp))
    else:
        logp = torch.log_softmax(logits / s.temperature, dim=-1)
        probs = logp.exp()
        if s.top_k and s.top_k < probs.numel():
            kth = torch.topk(probs, s.top_k).values[-1]
            probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
        if s.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always).
            drop = (torch.cumsum(ordered, dim=-1) - ordered) >= s.top_p * ordered.sum()
            drop[0] = False  # a top_p so small that its mass underflows still keeps one token
            ordered = torch.where(drop, torch.zeros_like(ordered), ordered)
            probs = torch.zeros_like(probs).scatter(0, order, ordered)
        token = int(torch.multinomial(probs, 1, generator=rng))
    alternatives: list[tuple[int, float]] = []
    if job.top_logprobs:
        values, indices = torch.topk(logp, min(job.top_logprobs, logp.numel()))
        alternatives = [(int(i), float(v)) for i, v in zip(indices, values, strict=True)]
    return token, float(logp[token]), alternatives


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    hits = [(text.find(stop), stop) for stop in stops if stop in text]
    return min(hits) if hits else None


def _eos_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)
