"""A tiny random-weight chat model, built on the spot: for tests, examples and debugging.

``build_tiny_model(path)`` writes a Llama-shaped causal LM with random weights and a byte-level
BPE tokenizer (trained here on a few built-in sentences) into ``path``; nothing is downloaded.
The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and with vLLM (its CPU
attention wants ``head_dim`` 64, hence the default 2 heads of a 128-wide model), and with
rollgym's CPU backend (``rollgym serve-model``). Byte-level: any text has a spelling in its
vocabulary, and ``decode`` gives back the bytes exactly.

The chat template is hermes-style, like Qwen's::

    <|im_start|>system\\n{system}\\n\\n# Tools\\n...<tools>\\n{tool json per line}</tools>...<|im_end|>\\n
    <|im_start|>user\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\\n
    <|im_start|>tool\\n<tool_response>{output}</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n                       (add_generation_prompt)

A tool call's ``arguments`` given as a string (as OpenAI messages carry them) is rendered
verbatim, so a call the model wrote re-renders as the same text on the next turn (no
re-tokenization drift from re-serialised JSON); given as a mapping, it is rendered with
``tojson``. ``<|im_end|>`` is the end-of-turn (EOS) token; ``<tool_call>``, ``</tool_call>``,
``<tool_response>`` and ``</tool_response>`` are single tokens that decoding keeps (vLLM's
``hermes`` tool parser looks them up in the vocabulary).

It is noise until trained: what it is good for is exercising the token plumbing end to end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "CHAT_TEMPLATE",
    "END_OF_TURN",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "build_tiny_model",
]

BEGIN_OF_TURN = "<|im_start|>"
END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

CHAT_TEMPLATE = (
    # No whitespace control and no literal newline right after a block tag: transformers
    # renders with trim_blocks, which would eat it; newlines after tags are written as {{ nl }}.
    "{% set nl = '\\n' %}"
    "{% macro call_text(tc) %}"
    "{% set f = tc['function'] if tc['function'] is defined else tc %}"
    '<tool_call>{"name": "{{ f["name"] }}", "arguments": '
    "{% if f['arguments'] is string %}{{ f['arguments'] }}"
    "{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "}</tool_call>"
    "{% endmacro %}"
    "{% set ns = namespace(first=0) %}"
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] or '' }}{{ nl }}{{ nl }}"
    "{% set ns.first = 1 %}{% endif %}"
    "# Tools\nYou may call one or more functions. Their signatures:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}{{ nl }}{% endfor %}"
    "</tools>\nFor each call write <tool_call>"
    '{"name": <function-name>, "arguments": <args-json-object>}'
    "</tool_call><|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if loop.index0 >= ns.first %}"
    "{% if m['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{{ m['content'] or '' }}"
    "{% for tc in (m['tool_calls'] or []) %}{{ call_text(tc) }}{% endfor %}"
    "<|im_end|>{{ nl }}"
    "{% elif m['role'] == 'tool' %}"
    "<|im_start|>tool\n<tool_response>{{ m['content'] or '' }}</tool_response><|im_end|>{{ nl }}"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ nl }}{% endif %}"
)
"""The hermes-style chat template (see the module docstring for what it renders)."""

_CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "hello world, what is the answer? The answer is 42.",
    "Which option is correct: A, B, C or D? The correct option is B.",
    '{"name": "lookup", "arguments": {"key": "alpha"}}',
    '{"echo": "value", "text": "hello"}',
    "You may call one or more functions. Their signatures:",
    "user assistant system tool function arguments name type object string properties",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
)


def build_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    intermediate_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 2,
    vocab_size: int = 1024,
    max_positions: int = 2048,
    corpus: Sequence[str] = (),
) -> Path:
    """Write a tiny random-weight Llama and its tokenizer into ``path``; return ``path``.

    ``seed`` fixes the weights (the tokenizer depends only on the corpus). ``vocab_size`` is
    an upper bound: the BPE trainer stops when the corpus (the built-in sentences plus
    ``corpus``) has no more merges. ``hidden_size // num_heads`` should be 64 for vLLM's CPU
    attention. The weights are float32 safetensors.
    """
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    specials = [PAD, BEGIN_OF_TURN, END_OF_TURN]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*_CORPUS, *corpus] * 20, trainer)
    # Markup the model writes: single tokens, but not "special", so decoding keeps them.
    markup = [TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in markup])
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=END_OF_TURN,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_positions,
    )
    tokenizer.save_pretrained(out)

    eos, pad = tok.token_to_id(END_OF_TURN), tok.token_to_id(PAD)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
        dtype="float32",
    )
    # The global RNG is saved and restored: building a model must not reseed the caller.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out)
    return out
