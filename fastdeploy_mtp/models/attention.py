"""Attention backends: the paged-KV-cache reference backend used for serving, and the
dense causal path used for training. Both consume the same projections of the same
modules, and ``tests/models`` checks that they agree."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import paddle
import paddle.nn.functional as F

from .forward_meta import ForwardMeta

if TYPE_CHECKING:
    from paddle._typing import DTypeLike


def _repeat_kv(x: paddle.Tensor, groups: int, axis: int) -> paddle.Tensor:
    """Repeat each key/value head ``groups`` times along ``axis`` (GQA -> MHA layout)."""
    if groups == 1:
        return x
    return paddle.repeat_interleave(x, groups, axis=axis)


class ReferenceAttentionBackend:
    """Paged-KV-cache attention, correct for any mix of prefill, chunked prefill and decode.

    For each item with new tokens it writes their keys/values into the cache blocks named
    by the block table, gathers positions ``0 .. past + n - 1`` back, and attends with a
    mask that is full over the ``past`` cached positions and causal within the ``n`` new
    ones. Math is float32; one item at a time (a reference, not a fast kernel).

    Args:
        num_heads: query heads.
        num_kv_heads: key/value heads (divides ``num_heads``).
        head_dim: per-head width.
        block_size: tokens per cache block.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"`num_heads` ({num_heads}) must be a multiple of `num_kv_heads` ({num_kv_heads})")
        if block_size <= 0:
            raise ValueError(f"`block_size` must be positive, got {block_size}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.scale = 1.0 / math.sqrt(head_dim)

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
        self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, layer_id: int, forward_meta: ForwardMeta
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
                raise ValueError(f"layer {layer_id} {name} cache must be {expected}, got {list(cache.shape)}")
        plan = forward_meta.plan()
        num_tokens = int(q.shape[0])
        out_dim = self.num_heads * self.head_dim
        if num_tokens == 0:
            return paddle.zeros([0, out_dim], dtype=q.dtype)
        real = plan.num_tokens  # rows past it are padding: not cached, zero output
        if real == 0:
            return paddle.zeros([num_tokens, out_dim], dtype=q.dtype)
        wb = paddle.to_tensor(plan.write_blocks)
        wo = paddle.to_tensor(plan.write_offsets)
        key_cache[wb, :, wo, :] = k[:real].astype(key_cache.dtype)
        value_cache[wb, :, wo, :] = v[:real].astype(value_cache.dtype)

        groups = self.num_heads // self.num_kv_heads
        outs = []
        for (_, q0, q1, past, total), rb, ro in zip(plan.items, plan.read_blocks, plan.read_offsets):
            rbt, rot = paddle.to_tensor(rb), paddle.to_tensor(ro)
            keys = key_cache[rbt, :, rot, :].astype("float32")  # [total, kvh, hd]
            values = value_cache[rbt, :, rot, :].astype("float32")  # [total, kvh, hd]
            keys = _repeat_kv(keys, groups, axis=1).transpose([1, 2, 0])  # [nh, hd, total]
            values = _repeat_kv(values, groups, axis=1).transpose([1, 0, 2])  # [nh, total, hd]
            qi = q[q0:q1].astype("float32").transpose([1, 0, 2])  # [nh, n, hd]
            scores = paddle.matmul(qi, keys) * self.scale  # [nh, n, total]
            n = q1 - q0
            if n > 1:
                # query i sits at position past + i and may see keys 0 .. past + i
                allowed = np.arange(total)[None, :] <= (past + np.arange(n))[:, None]
                bias = np.where(allowed, 0.0, -np.inf).astype(np.float32)
                scores = scores + paddle.to_tensor(bias)
            probs = F.softmax(scores, axis=-1)
            outs.append(paddle.matmul(probs, values).transpose([1, 0, 2]).reshape([n, out_dim]))
        if num_tokens > real:
            outs.append(paddle.zeros([num_tokens - real, out_dim], dtype="float32"))
        return paddle.concat(outs, axis=0).astype(q.dtype)


def causal_bias(seq_len: int) -> paddle.Tensor:
    """``[seq_len, seq_len]`` float32 additive mask: 0 on and below the diagonal, -inf above.
    Build it once per sequence length (``paddle.triu`` per step is slow on CPU)."""
    upper = np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)
    return paddle.to_tensor(np.where(upper, -np.inf, 0.0).astype(np.float32))


def dense_causal_attention(
    q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor | None, scale: float
) -> paddle.Tensor:
    """Causal attention over full sequences (training path).

    Args:
        q: ``[B, num_heads, S, head_dim]``.
        k, v: ``[B, num_kv_heads, S, head_dim]``.
        bias: ``[S, S]`` additive causal mask from :func:`causal_bias` (or a larger one; it is
            sliced to ``S``).
        scale: usually ``1/sqrt(head_dim)``.

    Returns:
        ``[B, S, num_heads * head_dim]``.
    """
    bsz, nh, seq, hd = q.shape
    groups = nh // int(k.shape[1])
    k = _repeat_kv(k, groups, axis=1)
    v = _repeat_kv(v, groups, axis=1)
    scores = paddle.matmul(q, k, transpose_y=True) * scale
    if bias is not None:
        scores = scores + bias[:seq, :seq]
    probs = F.softmax(scores, axis=-1)
    out = paddle.matmul(probs, v)  # [B, nh, S, hd]
    return out.transpose([0, 2, 1, 3]).reshape([bsz, seq, nh * hd])
