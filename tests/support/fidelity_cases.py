"""The model folders the draft-fidelity checks run on (engine:
``tests/models/test_draft_fidelity.py``; ``serve``: ``tests/serving/``), one per feature that
has hidden bugs before, and their prompts.

Vocab 300 everywhere; tokenizer 300 ids (unpadded: the last id an ordinary token) or 280 (ids
280..299 padded: never produced).
"""

from __future__ import annotations

import numpy as np

from tests.support import hf_ernie_folders, hf_folders, hf_mla_folders, hf_moe_folders
from tests.support.tokenizer_files import write_bpe_tokenizer

#: the prompts' lengths: 3 to 44 tokens, across the 16-token KV block boundary
PROMPT_LENS = (3, 9, 15, 16, 17, 44)


def fidelity_prompts() -> list[list[int]]:
    """Six random token-id prompts of :data:`PROMPT_LENS` tokens (ids 3..279: below every
    fixture tokenizer's size), the same on every call."""
    rng = np.random.default_rng(7)
    return [rng.integers(3, 280, size=n).tolist() for n in PROMPT_LENS]


def _tokenizer(size: int):
    return lambda out: write_bpe_tokenizer(str(out), size)


def _ernie(out, **kwargs):
    path = hf_ernie_folders.make_ernie_folder(out, **kwargs).path
    write_bpe_tokenizer(str(path), 300)
    return path


#: case -> (builder(out_dir) -> folder path)
CASES = {
    "llama-unpadded": lambda out: (
        hf_folders.make_folder(out, "llama", tokenizer_writer=_tokenizer(300)).path
    ),
    "qwen2-bias-padded": lambda out: (
        hf_folders.make_folder(out, "qwen2", tokenizer_writer=_tokenizer(280)).path
    ),
    "qwen3-qknorm": lambda out: (
        hf_folders.make_folder(out, "qwen3", sharded=False, tokenizer_writer=_tokenizer(300)).path
    ),
    "mimo": lambda out: hf_folders.make_folder(out, "mimo", tokenizer_writer=_tokenizer(280)).path,
    "glm45-echo-negbias": lambda out: (
        hf_moe_folders.make_glm_folder(
            out, echo=True, seed=2, negative_bias=True, tokenizer_writer=_tokenizer(280)
        ).path
    ),
    "glm45-qknorm-bias": lambda out: (
        hf_moe_folders.make_glm_folder(
            out, qk_norm=True, bias=True, negative_bias=True, tokenizer_writer=_tokenizer(300)
        ).path
    ),
    "ernie45-moe-echo": lambda out: _ernie(out, moe=True, echo=True),
    "ernie45-dense": lambda out: _ernie(out, moe=False, tie=False),
    "deepseekv3-negbias": lambda out: (
        hf_mla_folders.make_mla_folder(
            out, negative_bias=True, tokenizer_writer=_tokenizer(300)
        ).path
    ),
}
