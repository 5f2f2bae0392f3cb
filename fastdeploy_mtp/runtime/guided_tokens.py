"""llguidance's view of a model folder's tokenizer (built once per process and folder), and
the packed token bitmasks the grammar matchers fill: ``[rows, ceil(V / 32)]`` int32, bit set =
allowed."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=4)
def ll_tokenizer(folder: str, vocab_size: int, eos_ids: tuple[int, ...]) -> Any:
    """The ``LLTokenizer`` of the model folder's tokenizer over the model's ``vocab_size``
    ids (built once per process and folder: it indexes every token's bytes). Its EOS ids,
    which a grammar allows where it may end, are ``eos_ids`` and the folder's own (the
    tokenizer's ``eos_token``, ``generation_config.json``'s), as a served request's stop ids."""
    from llguidance import LLTokenizer, TokenizerWrapper

    from ..tokenization import load_generation_config
    from ..tokenization.tokenizer import load_tokenizer

    tok = load_tokenizer(folder)
    if tok.vocab_size > vocab_size:
        raise ValueError(
            f"{folder}: the tokenizer has {tok.vocab_size} tokens, more than the model's "
            f"vocabulary ({vocab_size})"
        )
    eos_ids = tuple(
        dict.fromkeys([*eos_ids, *tok.eos_token_ids, *load_generation_config(folder).eos_token_ids])
    )
    if not eos_ids:
        raise ValueError(
            f"{folder}: the model has no EOS id, so a constrained output could not end"
        )
    special = {
        int(i) for i, t in tok.backend.get_added_tokens_decoder().items() if t.special
    } | set(eos_ids)
    # Ids without text (the padded vocabulary) are special tokens no grammar names: never
    # allowed.
    special |= set(range(tok.vocab_size, vocab_size))
    tokens = [
        f"<|fdmtp_{i}|>".encode() if i in special else bytes(tok.token_bytes(i))
        for i in range(vocab_size)
    ]

    class _Source:
        """What ``llguidance.TokenizerWrapper`` reads of a tokenizer."""

        eos_token_id = eos_ids[0]
        bos_token_id = None

        def __init__(self) -> None:
            self.tokens = tokens
            self.special_token_ids = sorted(special)

        def __call__(self, text: str) -> list[int]:
            return tok.encode(text, add_special_tokens=False)

    return LLTokenizer(TokenizerWrapper(_Source()), eos_token=list(eos_ids))


def masked_logits(logits: Any, packed: np.ndarray) -> Any:
    """``logits`` ``[R, V]`` (Paddle) with the tokens whose bit is clear in ``packed``
    (``[R, ceil(V / 32)]`` int32 bitmasks, bit set = allowed) at ``-inf``."""
    import paddle

    v = int(logits.shape[1])
    allowed = np.unpackbits(packed.view(np.uint8), axis=1, bitorder="little")[:, :v].astype(bool)
    return paddle.where(paddle.to_tensor(allowed), logits, paddle.full_like(logits, float("-inf")))


def allows(mask: np.ndarray, token: int) -> bool:
    """Whether bitmask row ``mask`` (``[ceil(V / 32)]`` int32) allows ``token``."""
    return 0 <= token < 32 * mask.shape[0] and bool((int(mask[token >> 5]) >> (token & 31)) & 1)
