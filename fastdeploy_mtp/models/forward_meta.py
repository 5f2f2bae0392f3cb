"""Per-step metadata of a packed token batch (the model-side ``ForwardMeta``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import paddle
from numpy.typing import ArrayLike

from ..constants import NO_BLOCK_ID

#: Block-table entry meaning "no block" (:data:`fastdeploy_mtp.constants.NO_BLOCK_ID`).
UNUSED_BLOCK = NO_BLOCK_ID


@dataclass
class ForwardMeta:
    """What one forward over a packed batch needs besides the token ids.

    The batch has ``B`` items; item ``b`` contributes ``seq_lens_this_time[b]`` new tokens
    (0 is allowed), packed back to back in ``ids_remove_padding``. The new tokens of item
    ``b`` sit at positions ``seq_lens_decoder[b] .. seq_lens_decoder[b] +
    seq_lens_this_time[b] - 1`` of its sequence; positions below ``seq_lens_decoder[b]``
    are already in the KV cache. Attention is causal within the new tokens and full over
    the cached ones, so prefill, chunked prefill, decode and draft verification are all
    the same call.

    Attributes:
        ids_remove_padding: ``[T]`` int64, the packed new tokens, ``T >= sum(seq_lens_this_time)``:
            rows past the sum are padding (an engine that does not read the lengths back to
            the host passes an upper bound); they are not written to the cache, attention gives
            them zeros, and their outputs carry no meaning.
        cu_seqlens_q: ``[B + 1]`` int32, prefix sums of ``seq_lens_this_time`` starting at 0;
            the tokens of item ``b`` are ``ids_remove_padding[cu_seqlens_q[b]:cu_seqlens_q[b+1]]``.
        seq_lens_encoder: ``[B]`` int32, prompt tokens processed this step (prefill items);
            0 for decode items. Informational for the reference backend.
        seq_lens_decoder: ``[B]`` int32, tokens already in the cache before this step.
        seq_lens_this_time: ``[B]`` int32, new tokens of each item this step (>= 0).
        block_tables: ``[B, max_blocks_per_seq]`` int32, the cache block holding positions
            ``[j * block_size, (j + 1) * block_size)`` of item ``b`` is ``block_tables[b, j]``;
            ``-1`` (:data:`UNUSED_BLOCK`) marks an unused entry.
        caches: per layer, key cache then value cache (``caches[2*i]``, ``caches[2*i+1]``),
            each float32 of shape ``attn_backend.get_kv_cache_shape(num_blocks)``, i.e.
            ``[num_blocks, num_key_value_heads, block_size, head_dim]``. Written in place.
        block_size: tokens per cache block.
    """

    ids_remove_padding: paddle.Tensor
    cu_seqlens_q: paddle.Tensor
    seq_lens_encoder: paddle.Tensor
    seq_lens_decoder: paddle.Tensor
    seq_lens_this_time: paddle.Tensor
    block_tables: paddle.Tensor
    caches: list[paddle.Tensor] = field(default_factory=list)
    block_size: int = 16
    _plan: AttentionPlan | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"`block_size` must be positive, got {self.block_size}")

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens_this_time.shape[0])

    def build_plan(self) -> AttentionPlan:
        """(Re)derive the host-side indices from the current metadata. Models call this once
        at the start of every forward, because engines update the metadata tensors in place
        between steps and reuse the same ``ForwardMeta``."""
        self._plan = AttentionPlan.build(self)
        return self._plan

    def plan(self) -> AttentionPlan:
        """The indices built by the latest :meth:`build_plan` (built now if there is none),
        shared by every layer of one forward."""
        if self._plan is None:
            return self.build_plan()
        return self._plan


@dataclass
class AttentionPlan:
    """Host-side (numpy) view of a :class:`ForwardMeta`, validated once.

    Attributes:
        positions: ``[T]`` int64, the sequence position of every row (0 for padding rows).
        num_tokens: real (non-padding) rows, ``sum(seq_lens_this_time)``.
        write_blocks / write_offsets: ``[num_tokens]`` int64, cache block and in-block slot each
            new token's key and value are written to.
        items: per item with new tokens, ``(b, q_start, q_end, past, total)``: rows
            ``q_start:q_end`` of the packed batch, ``past`` cached tokens, ``total = past + n``.
        read_blocks / read_offsets: per entry of ``items``, ``[total]`` int64 slots holding
            positions ``0 .. total - 1``.
    """

    positions: np.ndarray
    num_tokens: int
    write_blocks: np.ndarray
    write_offsets: np.ndarray
    items: list
    read_blocks: list
    read_offsets: list

    @staticmethod
    def build(meta: ForwardMeta) -> AttentionPlan:
        this_time = np.asarray(meta.seq_lens_this_time.numpy()).reshape(-1).astype(np.int64)
        decoder = np.asarray(meta.seq_lens_decoder.numpy()).reshape(-1).astype(np.int64)
        cu = np.asarray(meta.cu_seqlens_q.numpy()).reshape(-1).astype(np.int64)
        tables = np.asarray(meta.block_tables.numpy()).astype(np.int64)
        bsz = this_time.shape[0]
        if decoder.shape[0] != bsz:
            raise ValueError(
                f"`seq_lens_decoder` must have {bsz} entries like `seq_lens_this_time`, got {decoder.shape[0]}"
            )
        if cu.shape[0] != bsz + 1:
            raise ValueError(f"`cu_seqlens_q` must have {bsz + 1} entries, got {cu.shape[0]}")
        if tables.ndim != 2 or tables.shape[0] != bsz:
            raise ValueError(f"`block_tables` must be [{bsz}, max_blocks], got {list(tables.shape)}")
        if (this_time < 0).any() or (decoder < 0).any():
            raise ValueError("`seq_lens_this_time` and `seq_lens_decoder` must be >= 0")
        if cu[0] != 0 or not np.array_equal(np.diff(cu), this_time):
            raise ValueError(
                f"`cu_seqlens_q` {cu.tolist()} is not the prefix sum of `seq_lens_this_time` {this_time.tolist()}"
            )
        num_tokens = int(cu[-1])
        ids_len = int(meta.ids_remove_padding.shape[0])
        if ids_len < num_tokens:
            raise ValueError(f"`ids_remove_padding` has {ids_len} tokens but sum(seq_lens_this_time) = {num_tokens}")
        bs = meta.block_size
        positions = np.zeros(ids_len, np.int64)
        write_blocks = np.zeros(num_tokens, np.int64)
        write_offsets = np.zeros(num_tokens, np.int64)
        items, read_blocks, read_offsets = [], [], []
        for b in range(bsz):
            n = int(this_time[b])
            if n == 0:
                continue
            past = int(decoder[b])
            total = past + n
            pos = np.arange(total, dtype=np.int64)
            col = pos // bs
            if col[-1] >= tables.shape[1]:
                raise ValueError(
                    f"item {b} needs {col[-1] + 1} cache blocks for {total} "
                    f"tokens but `block_tables` has {tables.shape[1]} columns"
                )
            blocks = tables[b, col]
            if (blocks < 0).any():
                bad = int(col[np.argmax(blocks < 0)])
                raise ValueError(
                    f"`block_tables[{b}, {bad}]` is unused (-1) but item {b} needs it for position {bad * bs}"
                )
            offsets = pos % bs
            q0, q1 = int(cu[b]), int(cu[b + 1])
            positions[q0:q1] = pos[past:]
            write_blocks[q0:q1] = blocks[past:]
            write_offsets[q0:q1] = offsets[past:]
            items.append((b, q0, q1, past, total))
            read_blocks.append(blocks)
            read_offsets.append(offsets)
        return AttentionPlan(positions, num_tokens, write_blocks, write_offsets, items, read_blocks, read_offsets)


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
