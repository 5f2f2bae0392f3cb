"""The JSON encoding of one buffer row of a handed-over slot state, and the range checks its
values pass: per row ``{"n": row length, "v": leading values, "fill": value of the remaining
n - len(v)}``, which keeps the mostly-empty ``[max_model_len]`` rows small."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..runtime.collaborators import HandoffError


def encode_row(row: np.ndarray) -> dict[str, Any]:
    """``row`` (any shape, flattened) as ``{"n", "v", "fill"}``: ``fill`` is its last value and
    ``v`` the values before the trailing run of it."""
    flat = row.reshape(-1)
    n = int(flat.shape[0])
    end = n
    while end > 0 and flat[end - 1] == flat[n - 1]:
        end -= 1
    fill = flat[n - 1].item() if n else 0
    return {"n": n, "v": [v.item() for v in flat[:end]], "fill": fill}


def decode_row(name: str, enc: object, shape: list[int], dtype: np.dtype) -> np.ndarray:
    """The row ``enc`` encodes, of ``shape`` and ``dtype``; :class:`HandoffError` naming the
    buffer ``name`` when it is not a row of that size with values of that kind."""
    if not isinstance(enc, Mapping) or set(enc) != {"n", "v", "fill"}:
        raise HandoffError(f"slot state `{name}`: expected an object with keys n, v, fill")
    n, values, fill = enc["n"], enc["v"], enc["fill"]
    size = int(np.prod(shape)) if shape else 1
    if not isinstance(n, int) or isinstance(n, bool) or n != size:
        raise HandoffError(
            f"slot state `{name}`: row of {n!r} values, this engine's rows have {size}"
        )
    if not isinstance(values, list) or len(values) > n:
        raise HandoffError(f"slot state `{name}`: `v` must be a list of at most {n} values")
    kind = "b" if dtype == np.bool_ else ("f" if dtype.kind == "f" else "i")
    for v in [*values, fill]:
        ok = (
            isinstance(v, bool)
            if kind == "b"
            else isinstance(v, (int, float) if kind == "f" else int)
        )
        if not ok or (kind == "i" and isinstance(v, bool)):
            raise HandoffError(f"slot state `{name}`: value {v!r} is not a {dtype} value")
    out = np.full([size], fill, dtype=dtype)
    try:
        out[: len(values)] = np.asarray(values, dtype=dtype) if values else out[:0]
    except OverflowError:
        raise HandoffError(f"slot state `{name}`: a value does not fit {dtype}") from None
    return out.reshape(shape)


#: Buffers holding lengths or counts (each in ``[0, max_model_len]``), and buffers holding
#: token ids (each ``-1`` or a token id, with ``vocab_size`` known).
_LENGTHS = {
    "prompt_lens",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "step_idx",
    "accept_num",
    "actual_draft_token_num",
    "input_ids_len",
    "min_dec_len",
    "bad_tokens_len",
    "used_list_len",
    "encoder_block_lens",
}
_TOKENS = {
    "input_ids",
    "token_ids_all",
    "draft_tokens",
    "accept_tokens",
    "pre_ids",
    "input_ids_cpu",
    "bad_tokens",
}


def check_values(
    where: str, name: str, row: np.ndarray, max_len: int, vocab_size: int | None
) -> None:
    """A handed-over row the ops could not take: a negative or too large length, a token id
    outside the vocabulary (a hostile or corrupted state must fail alone, before any step)."""
    if name in _LENGTHS and row.size and (row.min() < 0 or row.max() > max_len):
        raise HandoffError(
            f"slot state `{where}`: {int(row.min())}..{int(row.max())} outside [0, {max_len}]"
        )
    if name == "max_dec_len" and row.size and row.min() < 0:
        raise HandoffError(f"slot state `{where}`: must be >= 0, got {int(row.min())}")
    if (
        name in _TOKENS
        and vocab_size is not None
        and row.size
        and (row.min() < -1 or row.max() >= vocab_size)
    ):
        raise HandoffError(
            f"slot state `{where}`: token ids must be -1 or in [0, {vocab_size}), got "
            f"{row.min()}..{row.max()}"
        )
