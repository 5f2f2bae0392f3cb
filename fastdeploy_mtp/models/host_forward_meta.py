"""A :class:`~.forward_meta.ForwardMeta` built from host lists or arrays (the packed
batch's lengths, block tables and token ids), for tests, tools and the tiny checkpoint's
helpers; engines fill their device tensors in place instead."""

from __future__ import annotations

import numpy as np
import paddle
from numpy.typing import ArrayLike

from .forward_meta import ForwardMeta


def make_forward_meta(
    seq_lens_this_time: ArrayLike,
    seq_lens_decoder: ArrayLike,
    block_tables: ArrayLike,
    caches: list[paddle.Tensor],
    block_size: int,
    ids_remove_padding: ArrayLike | None = None,
    seq_lens_encoder: ArrayLike | None = None,
) -> ForwardMeta:
    """Build a :class:`ForwardMeta` from host lists/arrays (a helper for tests and tools).

    Args:
        seq_lens_this_time: ``[B]`` ints, new tokens per item.
        seq_lens_decoder: ``[B]`` ints, cached tokens per item.
        block_tables: ``[B, max_blocks]`` ints (``-1`` = unused).
        caches: list of cache tensors (see :class:`ForwardMeta`).
        block_size: tokens per block.
        ids_remove_padding: ``[T]`` ints; zeros if omitted.
        seq_lens_encoder: ``[B]`` ints; defaults to ``seq_lens_this_time`` for items with no
            cached tokens and 0 otherwise.
    """
    this_time = np.asarray(seq_lens_this_time, np.int32).reshape(-1)
    decoder = np.asarray(seq_lens_decoder, np.int32).reshape(-1)
    if seq_lens_encoder is None:
        seq_lens_encoder = np.where(decoder == 0, this_time, 0).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(this_time)]).astype(np.int32)
    if ids_remove_padding is None:
        ids_remove_padding = np.zeros(int(cu[-1]), np.int64)
    return ForwardMeta(
        ids_remove_padding=paddle.to_tensor(np.asarray(ids_remove_padding, np.int64).reshape(-1)),
        cu_seqlens_q=paddle.to_tensor(cu),
        seq_lens_encoder=paddle.to_tensor(np.asarray(seq_lens_encoder, np.int32).reshape(-1)),
        seq_lens_decoder=paddle.to_tensor(decoder),
        seq_lens_this_time=paddle.to_tensor(this_time),
        block_tables=paddle.to_tensor(np.asarray(block_tables, np.int32)),
        caches=caches,
        block_size=block_size,
    )
