"""The paged-KV-cache reference attention backend used for serving
(:class:`ReferenceAttentionBackend`): writes each step's keys and values into the block
caches and attends over them in the layout (shared, per row, grouped) that costs the least
for the step's plan. The dense causal path used for training is :mod:`.dense_attention`;
both consume the same projections of the same modules, and ``tests/models`` checks that they
agree."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import paddle
import paddle.nn.functional as F

from .forward_meta import AttentionPlan, ForwardMeta, int_range, minus_inf

if TYPE_CHECKING:
    from paddle._typing import DTypeLike


#: The attention layouts of :class:`ReferenceAttentionBackend` (see ``choose_layout``).
LAYOUTS = ("shared", "row", "grouped")

#: The grouped layout's extra fixed cost per layer (two more gathers and reshapes), in the
#: multiply-adds of ``ReferenceAttentionBackend.layout_cost``: measured with the shipped
#: target on a CPU at a context of ~300, the grouped layout starts beating the per-row one
#: between 16 and 24 rows (at batch 8 x 4 rows it takes ~2.4 ms a forward against ~6.2 ms).
GROUPED_OVERHEAD = 500_000


class ReferenceAttentionBackend:
    """Paged-KV-cache attention, correct for any mix of prefill, chunked prefill and decode.

    Each real row's key and value are written to the cache slot its position names in its
    item's block table (padding rows write nothing new); then every row attends to positions
    ``0 .. span - 1`` of its item (``span`` = the plan's ``num_read_blocks * block_size``) that
    are ``<=`` its own position: full over the cached ones, causal within the new ones.
    Everything is indexed on the device from
    :class:`~fastdeploy_mtp.models.forward_meta.AttentionPlan`, with shapes fixed by host
    ints, so a forward reads nothing back. Math is float32 and batched, in one of three
    layouts (:meth:`choose_layout`); it is a reference, not a fast kernel.

    Slots a row may not see are still read (whole blocks are gathered) and then masked: their
    scores are replaced, but their values are multiplied by a zero probability, so they must
    hold finite numbers. Zero-initialised caches (:meth:`allocate_caches`, the cache
    manager's) and keys/values left by earlier requests always do.

    Args:
        num_heads: query heads.
        num_kv_heads: key/value heads (divides ``num_heads``).
        head_dim: per-head width.
        block_size: tokens per cache block.
    """

    #: What each layer's caches hold, in order (a key and a value cache).
    cache_kinds = ("key", "value")

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"`num_heads` ({num_heads}) must be a multiple of `num_kv_heads` ({num_kv_heads})"
            )
        if block_size <= 0:
            raise ValueError(f"`block_size` must be positive, got {block_size}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.scale = 1.0 / math.sqrt(head_dim)
        #: ``None``: :meth:`choose_layout` picks the layout per forward; one of :data:`LAYOUTS`
        #: forces it (tests check that all give the same result).
        self.force_layout: str | None = None

    @property
    def force_shared_keys(self) -> bool | None:
        """The older switch: True forces the ``"shared"`` layout, False the ``"row"`` one,
        ``None`` lets :meth:`choose_layout` pick (reads ``None`` while ``"grouped"`` is forced)."""
        return {"shared": True, "row": False}.get(self.force_layout or "")

    @force_shared_keys.setter
    def force_shared_keys(self, value: bool | None) -> None:
        self.force_layout = None if value is None else ("shared" if value else "row")

    def get_kv_cache_shape(self, max_num_blocks: int) -> list[int]:
        """Shape of one layer's key (or value) cache:
        ``[max_num_blocks, num_kv_heads, block_size, head_dim]``."""
        if max_num_blocks <= 0:
            raise ValueError(f"`max_num_blocks` must be positive, got {max_num_blocks}")
        return [int(max_num_blocks), self.num_kv_heads, self.block_size, self.head_dim]

    def allocate_caches(
        self, num_layers: int, max_num_blocks: int, dtype: DTypeLike = "float32"
    ) -> list[paddle.Tensor]:
        """Zeroed caches for ``num_layers`` layers: ``[k0, v0, k1, v1, ...]``."""
        shape = self.get_kv_cache_shape(max_num_blocks)
        return [paddle.zeros(shape, dtype=dtype) for _ in range(2 * num_layers)]

    def forward(
        self,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        layer_id: int,
        forward_meta: ForwardMeta,
    ) -> paddle.Tensor:
        """Write ``k``/``v`` into the layer's cache and attend.

        Args:
            q: ``[T, num_heads, head_dim]`` float32, RoPE already applied.
            k: ``[T, num_kv_heads, head_dim]`` float32, RoPE already applied.
            v: ``[T, num_kv_heads, head_dim]`` float32.
            layer_id: index into ``forward_meta.caches`` (``2*layer_id``, ``2*layer_id+1``),
                counted within the model that owns the caches (the MTP layer uses 0).
            forward_meta: batch metadata.

        Returns:
            ``[T, num_heads * head_dim]`` float32.
        """
        if forward_meta.block_size != self.block_size:
            raise ValueError(
                f"`forward_meta.block_size` ({forward_meta.block_size}) differs "
                f"from the backend's block_size ({self.block_size})"
            )
        if len(forward_meta.caches) < 2 * layer_id + 2:
            raise ValueError(
                f"`forward_meta.caches` has {len(forward_meta.caches)} tensors; "
                f"layer {layer_id} needs at least {2 * layer_id + 2}"
            )
        key_cache = forward_meta.caches[2 * layer_id]
        value_cache = forward_meta.caches[2 * layer_id + 1]
        expected = self.get_kv_cache_shape(int(key_cache.shape[0]))
        for name, cache in (("key", key_cache), ("value", value_cache)):
            if list(cache.shape) != expected:
                raise ValueError(
                    f"layer {layer_id} {name} cache must be {expected}, got {list(cache.shape)}"
                )
        plan = forward_meta.plan()
        num_tokens = int(q.shape[0])
        out_dim = self.num_heads * self.head_dim
        if plan.num_rows != num_tokens:
            raise ValueError(
                f"`q` has {num_tokens} rows but the forward_meta plan describes {plan.num_rows}"
            )
        if num_tokens == 0:
            return paddle.zeros([0, out_dim], dtype=q.dtype)
        kind = self.choose_layout(plan)
        key = ("attention", self.num_heads, self.num_kv_heads, self.head_dim, kind)
        layout = plan.memo(key, lambda: self._layout(plan, kind))
        self._write(key_cache, k, plan, layout)
        self._write(value_cache, v, plan, layout)

        kvh, groups, hd = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        keys = self._read(key_cache, layout)
        values = self._read(value_cache, layout)
        qs = (q if q.dtype == paddle.float32 else q.astype("float32")) * self.scale
        qs = qs.reshape([num_tokens, kvh, groups, hd])  # query head h reads kv head h // groups
        if kind == "grouped":
            out = self._grouped_attend(qs, keys, values, layout)
        else:
            if (
                kind == "shared"
            ):  # [kvh, groups, T, hd] against every item's keys [kvh, 1, B * span, hd]
                qs = qs.transpose([1, 2, 0, 3])
            # scores: shared [kvh, groups, T, S], row [T, kvh, groups, S] against [T, kvh, S, hd]
            scores = paddle.where(
                layout.visible, paddle.matmul(qs, keys, transpose_y=True), layout.hidden
            )
            out = paddle.matmul(F.softmax(scores, axis=-1), values)
            if kind == "shared":
                out = out.transpose([2, 0, 1, 3])
        out = out.reshape([num_tokens, out_dim]) * layout.row_scale  # padding rows: zeros
        return out if out.dtype == q.dtype else out.astype(q.dtype)

    def _grouped_attend(
        self, qs: paddle.Tensor, keys: paddle.Tensor, values: paddle.Tensor, layout: _Layout
    ) -> paddle.Tensor:
        """Attention in the grouped layout.

        Args:
            qs: ``[T, kvh, groups, hd]`` float32 scaled queries, packed rows.
            keys, values: ``[B, kvh, span, hd]`` float32, each item's positions ``0 .. span - 1``.
            layout: a ``"grouped"`` layout.

        Returns:
            ``[T * kvh, groups, hd]`` float32, rows then kv heads (padding rows: some finite
            values, for the caller to zero).
        """
        t, kvh, groups, hd = (int(n) for n in qs.shape)
        nb, qm = layout.key_shape[0], layout.rows_per_item
        assert layout.query_index is not None and layout.out_index is not None
        # one gather both pads and transposes: (row, kv head) pairs in [B, kvh, Qmax] order
        slots = paddle.gather(qs.reshape([t * kvh, groups, hd]), layout.query_index)
        slots = slots.reshape([nb, kvh, qm * groups, hd])
        scores = paddle.matmul(slots, keys, transpose_y=True)  # [B, kvh, Qmax * groups, span]
        scores = paddle.where(
            layout.visible, scores, layout.hidden
        )  # mask [B, 1, Qmax * groups, span]
        out = paddle.matmul(F.softmax(scores, axis=-1), values).reshape([nb * kvh * qm, groups, hd])
        return paddle.gather(out, layout.out_index)  # [T * kvh, groups, hd], row-major again

    def choose_layout(self, plan: AttentionPlan) -> str:
        """Which of three equivalent layouts a forward uses (:attr:`force_layout` overrides):

        - ``"shared"``: every row scores every item's keys, other items masked (``B`` times
          the scores); suits prefill and batch 1.
        - ``"row"``: every row gathers its own item's keys (``T / B`` copies of them).
        - ``"grouped"``: each item's keys are gathered once and scored by its rows' queries,
          padded to ``Qmax`` = :attr:`AttentionPlan.max_rows_per_item` slots per item
          (``B * Qmax`` query slots); needs that bound when chosen here (forced without
          it, ``Qmax = T``). Suits decode and verify batches (many items, few rows each).

        The shared layout is taken when ``B * B <= T``, else the per-row one; with the bound,
        the grouped layout replaces it when its estimated cost (:meth:`layout_cost`) is
        lower.
        """
        if self.force_layout is not None:
            if self.force_layout not in LAYOUTS:
                raise ValueError(
                    f"`force_layout` must be one of {LAYOUTS} or None, got {self.force_layout!r}"
                )
            return self.force_layout
        b, t, qm = plan.num_items, plan.num_rows, plan.max_rows_per_item
        kind = "shared" if b * b <= t else "row"
        if qm is not None and self.layout_cost("grouped", b, t, plan.span, qm) < self.layout_cost(
            kind, b, t, plan.span, qm
        ):
            return "grouped"
        return kind

    def layout_cost(self, kind: str, items: int, rows: int, span: int, rows_per_item: int) -> int:
        """Estimated cost of one layer in layout ``kind``, in multiply-adds: the key and value
        elements gathered (``B`` or ``T`` copies of ``span`` positions per kv head) plus
        ``head_dim`` per score element (``T * B``, ``T`` or ``B * Qmax`` queries per query head
        against ``span`` positions each); the grouped layout adds
        :data:`GROUPED_OVERHEAD` for its extra index ops."""
        copies, queries = {
            "shared": (items, rows * items),
            "row": (rows, rows),
            "grouped": (items, items * rows_per_item),
        }[kind]
        gathered = 2 * copies * self.num_kv_heads * self.head_dim
        fixed = GROUPED_OVERHEAD if kind == "grouped" else 0
        return span * (gathered + queries * self.num_heads * self.head_dim) + fixed

    def _layout(self, plan: AttentionPlan, kind: str) -> _Layout:
        """The indices and masks of one plan for this backend's shapes (built once per
        forward, shared by its layers)."""
        t, kvh = plan.num_rows, self.num_kv_heads
        heads = int_range(kvh)
        blocks = plan.write_blocks.unsqueeze(1)  # [T, 1]
        offsets = plan.write_offsets.unsqueeze(1)  # [T, 1]
        slot_heads = heads.unsqueeze(0)  # [1, kvh]
        slots = paddle.stack(
            [blocks.expand([t, kvh]), slot_heads.expand([t, kvh]), offsets.expand([t, kvh])],
            axis=-1,
        )
        rows_per_item, query_index, out_index = 1, None, None
        if kind == "grouped":  # each item's blocks once: cache rows [B, kvh, nblk]
            nb = plan.num_items
            rows_per_item = t if plan.max_rows_per_item is None else plan.max_rows_per_item
            read = plan.item_blocks.unsqueeze(1) * kvh + heads.reshape([1, kvh, 1])
            span = plan.span
            starts = plan.row_starts[:nb]
            # query slot (b, i) holds row starts[b] + i (clamped; slots past the item's rows
            # hold another row and are never read back)
            slot_rows = paddle.clip(
                starts.unsqueeze(1) + int_range(rows_per_item).unsqueeze(0), max=t - 1
            )
            slot_positions = paddle.gather(plan.positions, slot_rows.reshape([-1]))
            groups = self.num_heads // kvh
            if groups > 1:  # every query head of a slot shares its mask
                slot_positions = slot_positions.repeat_interleave(groups)
            visible = int_range(span).reshape([1, 1, 1, span]) <= slot_positions.reshape(
                [nb, 1, -1, 1]
            )
            # queries viewed as [T * kvh, groups, hd]: slot (b, h, i) takes (row, h)
            query_index = (slot_rows.unsqueeze(1) * kvh + heads.reshape([1, kvh, 1])).reshape([-1])
            # row r reads slot (b, i) = (its item, r - starts[b]) of each head h, from the
            # output viewed as [B * kvh * Qmax, groups, hd]
            within = paddle.clip(
                int_range(t) - paddle.gather(starts, plan.items), min=0, max=rows_per_item - 1
            )
            item_heads = plan.items.unsqueeze(1) * kvh + heads.unsqueeze(0)  # [T, kvh]
            out_index = (item_heads * rows_per_item + within.unsqueeze(1)).reshape([-1])
            key_shape = [nb, kvh, span, self.head_dim]
        elif kind == "shared":  # every item's blocks, head-major: cache rows [kvh, B, nblk]
            read = plan.item_blocks.unsqueeze(0) * kvh + heads.reshape([kvh, 1, 1])
            span = plan.num_items * plan.span
            visible = plan.batch_key_mask()  # [T, B * span], broadcast over [kvh, groups]
            key_shape = [kvh, 1, span, self.head_dim]
        else:  # each row's item's blocks: cache rows [T, kvh, nblk]
            read = paddle.gather(plan.item_blocks, plan.items).unsqueeze(1) * kvh + heads.reshape(
                [1, kvh, 1]
            )
            span = plan.span
            visible = plan.row_key_mask().reshape([t, 1, 1, span])
            key_shape = [t, kvh, span, self.head_dim]
        return _Layout(
            write_index=(blocks, slot_heads, offsets),
            write_slots=slots,
            read_index=read.reshape([-1]),
            key_shape=key_shape,
            visible=visible,
            hidden=minus_inf(),
            row_scale=plan.valid.astype("float32").unsqueeze(1),
            rows_per_item=rows_per_item,
            query_index=query_index,
            out_index=out_index,
        )

    def _write(
        self, cache: paddle.Tensor, new: paddle.Tensor, plan: AttentionPlan, layout: _Layout
    ) -> None:
        """Store ``new [T, kvh, hd]`` at each row's slot in place. Padding rows repeat the last
        real row (same slot, same value); with no real row, every slot gets its own value
        back, so duplicate indices never carry different values."""
        value = paddle.gather(new, plan.write_rows)  # [T, kvh, hd]
        if value.dtype != cache.dtype:
            value = value.astype(cache.dtype)
        held = paddle.gather_nd(cache, layout.write_slots)  # [T, kvh, hd]
        paddle.index_put_(cache, layout.write_index, paddle.where(plan.any_valid, value, held))

    def _read(self, cache: paddle.Tensor, layout: _Layout) -> paddle.Tensor:
        """Gather keys or values in ``layout.key_shape``, float32. The cache is read as ``[blocks *
        kvh, bs, hd]`` rows already in the wanted order: no transpose (on a CPU a transpose
        costs more than the gather)."""
        got = paddle.gather(cache.reshape([-1, self.block_size, self.head_dim]), layout.read_index)
        got = got.reshape(layout.key_shape)
        return got if got.dtype == paddle.float32 else got.astype("float32")


@dataclass
class _Layout:
    """Per-forward indices and masks of :class:`ReferenceAttentionBackend` in one of its three
    layouts (every row scoring every item's keys, each row its own item's, or each item's
    padded rows its own keys).

    Attributes:
        write_index: ``(blocks [T, 1], heads [1, kvh], offsets [T, 1])`` int32, broadcasting to
            the slot of every row's key/value per head.
        write_slots: the same expanded and stacked, ``[T, kvh, 3]``.
        read_index: int32 rows of the cache viewed as ``[blocks * kvh, block_size,
            head_dim]``, ordered ``[kvh, B, nblk]`` (shared), ``[T, kvh, nblk]`` (row) or
            ``[B, kvh, nblk]`` (grouped).
        key_shape: ``[kvh, 1, B * span, head_dim]``, ``[T, kvh, span, head_dim]`` or ``[B,
            kvh, span, head_dim]``.
        visible: bool, which keys each query sees, broadcasting to the scores: ``[T, B * span]``
            against ``[kvh, groups, T, B * span]``, ``[T, 1, 1, span]`` against ``[T, kvh,
            groups, span]``, or ``[B, 1, Qmax, 1, span]`` against ``[B, kvh, Qmax, groups,
            span]`` (query slot ``i`` of item ``b`` sees position ``j`` iff ``j <=`` its
            position; stored as ``[B, 1, Qmax * groups, span]``).
        hidden: ``[1]`` float32 ``-inf``, the score of a key a query may not see.
        row_scale: ``[T, 1]`` float32, 1 for real rows and 0 for padding rows.
        rows_per_item: ``Qmax``, query slots per item (grouped; 1 otherwise).
        query_index: grouped only, ``[B * kvh * Qmax]`` int32: query slot ``(b, h, i)`` takes
            row ``(r, h)`` of the queries viewed as ``[T * kvh, groups, head_dim]``.
        out_index: grouped only, ``[T * kvh]`` int32: row ``(r, h)`` of the output reads slot
            ``(b, h, i)`` of the grouped output viewed as ``[B * kvh * Qmax, groups,
            head_dim]``.
    """

    write_index: tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]
    write_slots: paddle.Tensor
    read_index: paddle.Tensor
    key_shape: list[int]
    visible: paddle.Tensor
    hidden: paddle.Tensor
    row_scale: paddle.Tensor
    rows_per_item: int = 1
    query_index: paddle.Tensor | None = None
    out_index: paddle.Tensor | None = None
