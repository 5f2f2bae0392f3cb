"""Tokenizer folders for tests: :func:`write_bpe_tokenizer` trains a small byte-level BPE
(the kind Qwen and GPT-2 use) on a built-in text with the ``tokenizers`` library and writes
``tokenizer.json`` + ``tokenizer_config.json`` with a ChatML chat template."""

from __future__ import annotations

import json
import os
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

#: Training text: English, accented Latin, CJK and emoji, so that merges make tokens of
#: several bytes, some of them holding part of a character.
TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs on and on.
Speculative decoding drafts a few tokens and the target model verifies them in one step.
A café in Zürich serves crème brûlée; naïve coöperation is déjà vu for the señor.
日本語のテキストも少し入れます。東京と大阪と京都。中文也有一点：你好，世界！
Emoji travel too: 🎉🚀✨ and 👩‍💻 at work, ½ of ⅓ is ⅙, and 3 × 4 = 12 → done.
def add(a, b):\n    return a + b  # indented code with tabs\tand spaces
"""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

#: ChatML, as Qwen-style models write it: a default system message when the chat has
#: none, ``raise_exception`` for an unknown role, BOS when the tokenizer has one.
CHATML_TEMPLATE = """\
{%- if bos_token %}{{ bos_token }}{% endif %}
{%- for message in messages %}
    {%- if message['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('Unexpected role: ' + message['role']) }}
    {%- endif %}
    {%- if loop.first and message['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


def write_bpe_tokenizer(
    out_dir: str,
    vocab_size: int = 300,
    *,
    chat_template: str = CHATML_TEMPLATE,
    bos_token: str | None = None,
    eos_token: str = "<|im_end|>",
    prepend_bos: bool = False,
    extra_config: dict[str, Any] | None = None,
) -> str:
    """Train a byte-level BPE of ``vocab_size`` ids (the special tokens ``<|endoftext|>``,
    ``<|im_start|>``, ``<|im_end|>`` = 0, 1, 2, the 256 byte tokens, then merges) and write
    ``tokenizer.json`` and ``tokenizer_config.json`` (``extra_config`` merged in) to
    ``out_dir``; returns it. ``prepend_bos``: the post-processor puts ``bos_token`` before
    every encoded text (as Llama's ``tokenizer.json`` does)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    if prepend_bos:
        if bos_token is None:
            raise ValueError("prepend_bos needs a bos_token")
        bos = (bos_token, tok.token_to_id(bos_token))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos_token}:0 $A:0",
            pair=f"{bos_token}:0 $A:0 {bos_token}:1 $B:1",
            special_tokens=[bos],
        )
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos_token,
        "eos_token": eos_token,
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": chat_template,
        **(extra_config or {}),
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    return out_dir
