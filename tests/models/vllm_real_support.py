"""What the opt-in tests against a REAL vLLM share (``test_vllm_real``, ``test_vllm_weights_real``,
``test_vllm_freeze_real``): the opt-in marker, the tiny random Llama and its tokenizer written at
test time (nothing is downloaded), and a vLLM OpenAI server started on it and stopped with its
engine processes.

Opt-in: ``ROLLGYM_REAL_SERVER=1`` and ``ROLLGYM_VLLM_PYTHON`` naming a Python that can ``import
vllm`` (``test_vllm_real``'s docstring shows the install).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from rollgym.testing import bind_socket

PYTHON = os.environ.get("ROLLGYM_VLLM_PYTHON", "")

real_vllm = pytest.mark.skipif(
    os.environ.get("ROLLGYM_REAL_SERVER") != "1" or not PYTHON,
    reason="opt-in: set ROLLGYM_REAL_SERVER=1 and ROLLGYM_VLLM_PYTHON (see test_vllm_real)",
)
"""The opt-in marker of every real-vLLM test."""

STARTUP_SECONDS = 300.0

MAKE_MODEL = r"""
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
positions = int(sys.argv[2]) if len(sys.argv) > 2 else 512
specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
)
corpus = ["the quick brown fox jumps over the lazy dog", "hello world"] * 50
tok.train_from_iterator(corpus, trainer)
template = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>",
    chat_template=template,
).save_pretrained(out)
# head_dim 64: vLLM's CPU attention has no kernel for head_dim 16.
config = LlamaConfig(
    vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
    max_position_embeddings=positions, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    tie_word_embeddings=False,
)
LlamaForCausalLM(config).save_pretrained(out)
"""
"""Writes the tiny model to ``argv[1]`` (``argv[2]``: its max positions, 512 by default)."""

VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a large share of the memory
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a container may not allow pinning threads
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


class Vllm(NamedTuple):
    url: str
    pid: int
    """The API server's process (its engine runs in another, its child)."""


def make_model(out: Path, positions: int = 512) -> Path:
    """The tiny random Llama and its tokenizer, written to ``out``."""
    subprocess.run([PYTHON, "-c", MAKE_MODEL, str(out), str(positions)], check=True, timeout=300)
    return out


@contextlib.contextmanager
def serve_vllm(
    model: Path,
    log_path: Path,
    *,
    max_model_len: int = 256,
    max_num_seqs: int = 4,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[Vllm]:
    """A real vLLM OpenAI server on 127.0.0.1 serving ``model`` as ``tiny`` (its output in
    ``log_path``), stopped with its engine processes at the end."""
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    # The module, not the ``vllm`` script: the script looks up the "vllm" distribution's
    # version, and vllm-cpu installs under another name.
    command = [
        PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
        "--enforce-eager", "--dtype", "float32", *args,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        # Its own session: vLLM starts an engine process and workers, stopped with it below.
        proc = subprocess.Popen(
            command,
            env={**os.environ, **VLLM_ENV, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_healthy(proc, url, log_path)
            yield Vllm(url, proc.pid)
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server and the engine processes it started (its own process group), resumed
    first in case a test left one stopped."""
    for sig, wait in ((signal.SIGCONT, 0.0), (signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if not wait:
            continue
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            pytest.fail(f"vLLM exited with {proc.returncode} before it was healthy:\n{tail}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"vLLM not healthy after {STARTUP_SECONDS:g}s (log: {log})")
