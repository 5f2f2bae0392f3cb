"""Per-step metadata of a packed token batch (the model-side ``ForwardMeta``)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import paddle

from ..constants import NO_BLOCK_ID
from .linear_state import LinearStates

#: Block-table entry meaning "no block" (:data:`fastdeploy_mtp.constants.NO_BLOCK_ID`).
UNUSED_BLOCK = NO_BLOCK_ID

_Value = TypeVar("_Value")


@functools.lru_cache(maxsize=256)
def _constant(kind: str, n: int, device: str) -> paddle.Tensor:
    if kind == "range":
        return paddle.arange(n, dtype="int32")
    return paddle.full([n], -math.inf, dtype="float32")


def int_range(n: int) -> paddle.Tensor:
    """``[n]`` int32 ``0 .. n - 1`` on the current device. Cached per length and device and
    never written: ``paddle.arange`` costs tens of microseconds of dispatch, a noticeable
    part of a one-layer forward."""
    return _constant("range", n, paddle.get_device())


def minus_inf() -> paddle.Tensor:
    """``[1]`` float32 ``-inf`` on the current device (cached like :func:`int_range`)."""
    return _constant("minus_inf", 1, paddle.get_device())


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
        max_seq_len: a host-side upper bound on ``seq_lens_decoder[b] + seq_lens_this_time[b]``
            over every item, or ``None``. Attention gathers ``ceil(max_seq_len / block_size)``
            blocks per item (``None``: all ``block_tables.shape[1]`` columns), so a tight bound
            makes it cheaper; a bound that is too small silently drops the keys past it unless
            ``check`` is set.
        max_rows_per_item: a host-side upper bound on ``seq_lens_this_time[b]`` over every
            item, or ``None``. When set, attention may use its grouped layout (each item's
            keys gathered once, its rows' queries padded to this many slots), which suits
            decode and verify batches; a bound that is too small silently gives its item's
            extra rows meaningless outputs unless ``check`` is set.
        linear_states: the per-slot states of the model's linear-attention layers
            (:class:`~.linear_state.LinearStates`; item ``b`` is slot ``b``), written in place;
            ``None`` for a model without such layers.
        check: validate the metadata on the host before the forward (reads the length tensors
            and the block table back, a device sync on an accelerator) and raise a
            ``ValueError`` naming the inconsistent field. Serving code clears it in
            steady-state rounds: the forward itself then reads nothing back.
    """

    ids_remove_padding: paddle.Tensor
    cu_seqlens_q: paddle.Tensor
    seq_lens_encoder: paddle.Tensor
    seq_lens_decoder: paddle.Tensor
    seq_lens_this_time: paddle.Tensor
    block_tables: paddle.Tensor
    caches: list[paddle.Tensor] = field(default_factory=list)
    block_size: int = 16
    max_seq_len: int | None = None
    max_rows_per_item: int | None = None
    linear_states: LinearStates | None = None
    check: bool = True
    _plan: AttentionPlan | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"`block_size` must be positive, got {self.block_size}")
        if self.max_seq_len is not None and self.max_seq_len <= 0:
            raise ValueError(f"`max_seq_len` must be positive or None, got {self.max_seq_len}")
        if self.max_rows_per_item is not None and self.max_rows_per_item < 0:
            raise ValueError(
                f"`max_rows_per_item` must be >= 0 or None, got {self.max_rows_per_item}"
            )

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens_this_time.shape[0])

    def build_plan(self) -> AttentionPlan:
        """(Re)derive the per-row indices from the current metadata (on the device; with
        :attr:`check` set, after validating it on the host). Models call this once at the
        start of every forward, because engines update the metadata tensors in place between
        steps and reuse the same ``ForwardMeta``."""
        checked = validate_forward_meta(self) if self.check else None
        self._plan = AttentionPlan.build(self)
        self._plan.max_position = checked
        return self._plan

    def plan(self) -> AttentionPlan:
        """The indices built by the latest :meth:`build_plan` (built now if there is none),
        shared by every layer of one forward."""
        if self._plan is None:
            return self.build_plan()
        return self._plan


def validate_forward_meta(meta: ForwardMeta) -> int:
    """Check ``meta`` on the host (reads its length tensors and block table back) and return
    the largest position of a real row (-1 when there is none).

    Raises:
        ValueError: naming the field, when a length tensor has the wrong size or a negative
            entry, ``cu_seqlens_q`` is not the prefix sum of ``seq_lens_this_time``,
            ``ids_remove_padding`` is shorter than that sum, an item needs more block-table
            columns than there are or an entry that is unused (-1), or an item's
            ``seq_lens_decoder + seq_lens_this_time`` exceeds ``max_seq_len`` or its
            ``seq_lens_this_time`` exceeds ``max_rows_per_item``.
    """
    this_time = np.asarray(meta.seq_lens_this_time.numpy()).reshape(-1).astype(np.int64)
    decoder = np.asarray(meta.seq_lens_decoder.numpy()).reshape(-1).astype(np.int64)
    cu = np.asarray(meta.cu_seqlens_q.numpy()).reshape(-1).astype(np.int64)
    tables = np.asarray(meta.block_tables.numpy()).astype(np.int64)
    bsz = this_time.shape[0]
    if decoder.shape[0] != bsz:
        raise ValueError(
            f"`seq_lens_decoder` must have {bsz} entries like `seq_lens_this_time`, got "
            f"{decoder.shape[0]}"
        )
    if cu.shape[0] != bsz + 1:
        raise ValueError(f"`cu_seqlens_q` must have {bsz + 1} entries, got {cu.shape[0]}")
    if tables.ndim != 2 or tables.shape[0] != bsz:
        raise ValueError(f"`block_tables` must be [{bsz}, max_blocks], got {list(tables.shape)}")
    if (this_time < 0).any() or (decoder < 0).any():
        raise ValueError("`seq_lens_this_time` and `seq_lens_decoder` must be >= 0")
    if cu[0] != 0 or not np.array_equal(np.diff(cu), this_time):
        raise ValueError(
            f"`cu_seqlens_q` {cu.tolist()} is not the prefix sum of `seq_lens_this_time` "
            f"{this_time.tolist()}"
        )
    num_tokens = int(cu[-1])
    ids_len = int(meta.ids_remove_padding.shape[0])
    if ids_len < num_tokens:
        raise ValueError(
            f"`ids_remove_padding` has {ids_len} tokens but sum(seq_lens_this_time) = {num_tokens}"
        )
    bs = meta.block_size
    largest = -1
    for b in range(bsz):
        n = int(this_time[b])
        if n == 0:
            continue
        if meta.max_rows_per_item is not None and n > meta.max_rows_per_item:
            raise ValueError(
                f"item {b} has {n} rows this step but `max_rows_per_item` is "
                f"{meta.max_rows_per_item}"
            )
        total = int(decoder[b]) + n
        largest = max(largest, total - 1)
        if meta.max_seq_len is not None and total > meta.max_seq_len:
            raise ValueError(
                f"item {b} holds {total} tokens after this step but `max_seq_len` is "
                f"{meta.max_seq_len}"
            )
        needed = (total - 1) // bs + 1
        if needed > tables.shape[1]:
            raise ValueError(
                f"item {b} needs {needed} cache blocks for {total} tokens but `block_tables` has "
                f"{tables.shape[1]} columns"
            )
        unused = np.nonzero(tables[b, :needed] < 0)[0]
        if unused.size:
            bad = int(unused[0])
            raise ValueError(
                f"`block_tables[{b}, {bad}]` is unused (-1) but item {b} needs it for position "
                f"{bad * bs}"
            )
    return largest


@dataclass
class AttentionPlan:
    """Per-row indices of a :class:`ForwardMeta`, derived on the device.

    Every shape depends only on host-known ints: ``T = ids_remove_padding.shape[0]`` rows,
    ``B`` items, :attr:`num_read_blocks` and the block size, so building the plan reads
    nothing back to the host. Row ``r`` belongs to item ``b`` with ``cu_seqlens_q[b] <= r <
    cu_seqlens_q[b + 1]``; rows ``r >= cu_seqlens_q[B]`` are padding.

    Attributes:
        positions: ``[T]`` int32, the sequence position of every row,
            ``seq_lens_decoder[b] + r - cu_seqlens_q[b]`` (padding rows: the same formula
            with the last item, so some position ``>= 0`` that means nothing).
        valid: ``[T]`` bool, False for padding rows.
        items: ``[T]`` int32, the item of every row (padding rows: the last item).
        write_blocks / write_offsets: ``[T]`` int32, the cache block and in-block slot each
            row's key and value go to. A padding row repeats the last real row's slot (and
            :attr:`write_rows` its value), so it changes nothing.
        write_rows: ``[T]`` int32, the row whose key/value is written at each row's slot
            (the row itself, or the last real row for padding rows).
        any_valid: ``[1]`` bool, whether the batch has a real row at all; when it has none,
            every row's slot is written back with the value it already holds.
        row_starts: ``[B + 1]`` int32, ``cu_seqlens_q`` (``[2]`` zeros when :attr:`num_items`
            stands for no item).
        item_blocks: ``[max(B, 1), num_read_blocks]`` int32, the blocks holding positions
            ``0 .. span - 1`` of each item (``span = num_read_blocks * block_size``; unused
            entries replaced by block 0, which the key masks hide).
        num_read_blocks: blocks gathered per item, ``ceil(max_seq_len / block_size)`` capped
            at ``block_tables.shape[1]`` (all columns when ``max_seq_len`` is ``None``).
        block_size: tokens per cache block.
        max_rows_per_item: the host-side bound on any item's rows, ``min(T,
            ForwardMeta.max_rows_per_item)`` (at least 1), or ``None`` without a hint.
        max_position: the largest position of a real row, known on the host when the
            metadata was validated (``ForwardMeta.check``), else ``None``.
    """

    positions: paddle.Tensor
    valid: paddle.Tensor
    items: paddle.Tensor
    write_blocks: paddle.Tensor
    write_offsets: paddle.Tensor
    write_rows: paddle.Tensor
    any_valid: paddle.Tensor
    row_starts: paddle.Tensor
    item_blocks: paddle.Tensor
    num_read_blocks: int
    block_size: int
    max_rows_per_item: int | None = None
    max_position: int | None = None
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_rows(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_items(self) -> int:
        """Rows of :attr:`item_blocks` (``max(B, 1)``)."""
        return int(self.item_blocks.shape[0])

    @property
    def span(self) -> int:
        """Key positions gathered per item: ``num_read_blocks * block_size``."""
        return self.num_read_blocks * self.block_size

    def memo(self, key: object, build: Callable[[], _Value]) -> _Value:
        """``build()`` once per plan under ``key`` (attention backends keep the indices
        they derive from the plan here, so the layers of one forward share them)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def row_key_mask(self) -> paddle.Tensor:
        """``[T, span]`` bool: position ``j`` of row ``r``'s own item is visible to it iff
        ``j <= positions[r]`` (at least position 0). Built once per plan."""
        return self.memo(
            "row_key_mask", lambda: int_range(self.span) <= self.positions.unsqueeze(1)
        )

    def batch_key_mask(self) -> paddle.Tensor:
        """``[T, num_items * span]`` bool over every item's keys (item-major): key ``(b, j)``
        is visible to row ``r`` iff ``b`` is its item and ``j <= positions[r]``."""

        if self.num_items == 1:
            return self.row_key_mask()

        def build() -> paddle.Tensor:
            key_items = int_range(self.num_items).repeat_interleave(self.span)
            same_item = key_items.unsqueeze(0) == self.items.unsqueeze(1)
            return paddle.logical_and(same_item, self.row_key_mask().tile([1, self.num_items]))

        return self.memo("batch_key_mask", build)

    @staticmethod
    def build(meta: ForwardMeta) -> AttentionPlan:
        """Derive the plan of ``meta`` with tensor ops only (no host read). Metadata that
        :func:`validate_forward_meta` would refuse gives meaningless outputs but no
        out-of-bounds access: block-table columns and unused blocks are clamped. Few ops on
        purpose (each costs microseconds of dispatch, and a forward of one MTP layer cannot
        spread them over many layers)."""
        rows_n = int(meta.ids_remove_padding.shape[0])
        bsz = meta.batch_size
        bs = meta.block_size
        columns = int(meta.block_tables.shape[1])
        num_read = columns if meta.max_seq_len is None else min(columns, -(-meta.max_seq_len // bs))
        num_read = max(num_read, 1)
        rows = int_range(rows_n)
        hint = meta.max_rows_per_item
        rows_bound = None if hint is None else max(1, min(hint, rows_n))
        if bsz == 0 or columns == 0:
            # Nothing can be real: every row is padding and writes its slot's own value back.
            zeros = paddle.zeros([rows_n], dtype="int32")
            return AttentionPlan(
                positions=zeros,
                valid=paddle.zeros([rows_n], dtype="bool"),
                items=zeros,
                write_blocks=zeros,
                write_offsets=zeros,
                write_rows=zeros,
                any_valid=paddle.zeros([1], dtype="bool"),
                row_starts=paddle.zeros([2], dtype="int32"),
                item_blocks=paddle.zeros([1, num_read], dtype="int32"),
                num_read_blocks=num_read,
                block_size=bs,
                max_rows_per_item=rows_bound,
            )
        cu, decoder = _int32_vector(meta.cu_seqlens_q), _int32_vector(meta.seq_lens_decoder)
        tables = (
            meta.block_tables
            if meta.block_tables.dtype == paddle.int32
            else meta.block_tables.astype("int32")
        )
        tables = paddle.clip(tables[:, :num_read] if num_read < columns else tables, min=0)
        # item of a row: how many of the first B - 1 items end at or before it (so padding
        # rows land on the last item)
        items = paddle.searchsorted(cu[1:bsz], rows, right=True, out_int32=True)
        num_real = cu[bsz:]  # [1]
        positions = paddle.gather(decoder - cu[:bsz], items) + rows
        column = paddle.clip(positions // bs, max=num_read - 1)
        blocks = paddle.gather(tables.reshape([-1]), items * num_read + column)
        # a padding row repeats the last real row (row 0 when there is none)
        write_rows = paddle.minimum(rows, paddle.clip(num_real - 1, min=0))
        return AttentionPlan(
            positions=positions,
            valid=rows < num_real,
            items=items,
            write_blocks=paddle.gather(blocks, write_rows),
            write_offsets=paddle.gather(positions, write_rows) % bs,
            write_rows=write_rows,
            any_valid=num_real > 0,
            row_starts=cu,
            item_blocks=tables,
            num_read_blocks=num_read,
            block_size=bs,
            max_rows_per_item=rows_bound,
        )


def _int32_vector(t: paddle.Tensor) -> paddle.Tensor:
    """``t`` as a 1-D int32 tensor (no op when it already is one)."""
    if t.dtype != paddle.int32:
        t = t.astype("int32")
    return t if len(t.shape) == 1 else t.reshape([-1])
