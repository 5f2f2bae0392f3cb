"""Paged attention over a latent cache, for multi-head latent attention (DeepSeek's MLA).

Each layer owns ONE cache, ``[num_blocks, 1, block_size, kv_lora_rank + qk_rope_head_dim]``:
per token the normed compressed key/value ``c_kv`` (``kv_lora_rank`` values) followed by the
roped shared key part ``k_pe`` (``qk_rope_head_dim`` values). It is not per head, so under
tensor parallelism every rank holds the whole cache (each rank up-projects its own heads).

:class:`LatentAttentionBackend` writes the new tokens' latents at the slots their positions
name in the block table and attends for each row over its item's positions ``0 .. p``. With
``kv_b_proj`` split per head into ``W_uk`` (key, no-rope part) and ``W_uv`` (value), the keys
are ``[c W_uk ; k_pe]`` and the values ``c W_uv``. By default it never builds them: each query's
no-rope part is folded into the latent space (``q_nope W_uk^T``), scored against the cached
``[c ; k_pe]`` directly, and the weighted sum of ``c`` is up-projected by ``W_uv`` afterwards
(the absorbed path). ``absorbed = False`` rebuilds every key and value instead; both give the
same numbers up to float32 rounding (within 1e-5, tested), and on a CPU the absorbed path was
faster on every batch measured (DeepSeek-V3's per-rank shapes at TP 8, 16 heads: 8 decode rows
over 256 positions 57 ms against 500 ms; a 256-token prefill 420 ms against 1350 ms).

It uses the same :class:`~fastdeploy_mtp.models.forward_meta.AttentionPlan` as
:class:`~fastdeploy_mtp.models.attention.ReferenceAttentionBackend` (same masks, same
padding-row rules); ``forward_meta.caches[i]`` is layer ``i``'s latent cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import paddle
import paddle.nn.functional as F

from .forward_meta import AttentionPlan, ForwardMeta, minus_inf

if TYPE_CHECKING:
    from paddle._typing import DTypeLike


@dataclass(frozen=True)
class LatentShape:
    """The per-rank sizes of one MLA layer: ``num_heads`` (this rank's query heads),
    ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``."""

    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def latent_dim(self) -> int:
        """Values cached per token: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class LatentAttentionBackend:
    """Paged MLA attention over one latent cache per layer (see the module doc).

    Args:
        shape: this rank's :class:`LatentShape`.
        block_size: tokens per cache block.
        scale: the softmax scale (``1/sqrt(qk_head_dim)``, times YaRN's ``mscale**2``).
    """

    #: What each layer's caches hold, in order (one ``"latent"`` cache).
    cache_kinds = ("latent",)

    def __init__(self, shape: LatentShape, block_size: int, scale: float):
        if block_size <= 0:
            raise ValueError(f"`block_size` must be positive, got {block_size}")
        self.shape = shape
        self.block_size = block_size
        self.scale = float(scale)
        #: True: attend in the latent space (the absorbed path, the default: on this package's
        #: CPU measurements it is faster for decode, verify and prefill batches alike); False:
        #: rebuild every key and value first (the plain form; tests check both agree).
        self.absorbed = True

    @property
    def num_heads(self) -> int:
        return self.shape.num_heads

    def get_kv_cache_shape(self, max_num_blocks: int) -> list[int]:
        """Shape of one layer's latent cache: ``[max_num_blocks, 1, block_size, latent_dim]``."""
        if max_num_blocks <= 0:
            raise ValueError(f"`max_num_blocks` must be positive, got {max_num_blocks}")
        return [int(max_num_blocks), 1, self.block_size, self.shape.latent_dim]

    def allocate_caches(
        self, num_layers: int, max_num_blocks: int, dtype: DTypeLike = "float32"
    ) -> list[paddle.Tensor]:
        """Zeroed latent caches, one per layer: ``[c0, c1, ...]``."""
        shape = self.get_kv_cache_shape(max_num_blocks)
        return [paddle.zeros(shape, dtype=dtype) for _ in range(num_layers)]

    def layer_cache(self, layer_id: int, forward_meta: ForwardMeta) -> paddle.Tensor:
        """``forward_meta.caches[layer_id]``, checked against this backend's shape."""
        if forward_meta.block_size != self.block_size:
            raise ValueError(
                f"`forward_meta.block_size` ({forward_meta.block_size}) differs from the backend's "
                f"block_size ({self.block_size})"
            )
        if len(forward_meta.caches) <= layer_id:
            raise ValueError(
                f"`forward_meta.caches` has {len(forward_meta.caches)} tensors; latent layer "
                f"{layer_id} needs at least {layer_id + 1}"
            )
        cache = forward_meta.caches[layer_id]
        expected = self.get_kv_cache_shape(int(cache.shape[0]))
        if list(cache.shape) != expected:
            raise ValueError(
                f"layer {layer_id} latent cache must be {expected}, got {list(cache.shape)}"
            )
        return cache

    def forward(
        self,
        q: paddle.Tensor,
        latent: paddle.Tensor,
        kv_b_weight: paddle.Tensor,
        layer_id: int,
        forward_meta: ForwardMeta,
    ) -> paddle.Tensor:
        """Write the new tokens' latents into layer ``layer_id``'s cache and attend.

        Args:
            q: ``[T, num_heads, qk_nope_head_dim + qk_rope_head_dim]``, RoPE applied to the
                rope part (the last ``qk_rope_head_dim`` values of each head).
            latent: ``[T, kv_lora_rank + qk_rope_head_dim]``: normed ``c_kv`` then roped ``k_pe``.
            kv_b_weight: ``[kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim)]``, this
                rank's ``kv_b_proj`` weight (Paddle ``[in, out]`` layout, head-major columns).
            layer_id: index into ``forward_meta.caches``.
            forward_meta: batch metadata.

        Returns:
            ``[T, num_heads * v_head_dim]`` in ``q``'s dtype (zeros on padding rows).
        """
        cache = self.layer_cache(layer_id, forward_meta)
        plan = forward_meta.plan()
        t = int(q.shape[0])
        s = self.shape
        if plan.num_rows != t:
            raise ValueError(
                f"`q` has {t} rows but the forward_meta plan describes {plan.num_rows}"
            )
        if t == 0:
            return paddle.zeros([0, s.num_heads * s.v_head_dim], dtype=q.dtype)
        self._write(cache, latent, plan)
        latents = self._read(cache, plan)  # [B, span, latent_dim]
        w = kv_b_weight if kv_b_weight.dtype == paddle.float32 else kv_b_weight.astype("float32")
        q32 = (q if q.dtype == paddle.float32 else q.astype("float32")) * self.scale
        visible = plan.row_key_mask().reshape([t, 1, 1, plan.span])
        if self.absorbed:
            out = self._absorbed(q32, paddle.gather(latents, plan.items), w, visible)
        else:
            keys, values = self._rebuild(latents, w, plan.num_items, plan.span)
            rows_k = paddle.gather(keys, plan.items)  # [T, nh, span, qk]
            rows_v = paddle.gather(values, plan.items)  # [T, nh, span, v]
            scores = paddle.matmul(q32.unsqueeze(2), rows_k, transpose_y=True)  # [T, nh, 1, span]
            scores = paddle.where(visible, scores, minus_inf())
            out = paddle.matmul(F.softmax(scores, axis=-1), rows_v)  # [T, nh, 1, v]
        out = out.reshape([t, s.num_heads * s.v_head_dim]) * plan.valid.astype("float32").unsqueeze(
            1
        )
        return out if out.dtype == q.dtype else out.astype(q.dtype)

    def _absorbed(
        self, q: paddle.Tensor, latents: paddle.Tensor, w: paddle.Tensor, visible: paddle.Tensor
    ) -> paddle.Tensor:
        """Attention in the latent space.

        Args:
            q: ``[T, nh, qk]`` float32 scaled queries.
            latents: ``[T, span, latent_dim]`` float32, each row's item's cached latents.
            w: ``[L, nh * (nope + v)]`` float32, ``kv_b_proj``'s weight.
            visible: ``[T, 1, 1, span]`` bool.

        Returns:
            ``[T, nh, 1, v]`` float32: ``softmax([q_nope W_uk^T ; q_pe] . [c ; k_pe]) c W_uv``
            per head, the same numbers as rebuilding the keys and values (up to rounding).
        """
        s = self.shape
        t = int(q.shape[0])
        w = w.reshape([s.kv_lora_rank, s.num_heads, s.qk_nope_head_dim + s.v_head_dim]).transpose(
            [1, 0, 2]
        )
        w_uk, w_uv = (
            w[..., : s.qk_nope_head_dim],
            w[..., s.qk_nope_head_dim :],
        )  # [nh, L, nope], [nh, L, v]
        q_nope = q[..., : s.qk_nope_head_dim].transpose([1, 0, 2])  # [nh, T, nope]
        q_lat = paddle.matmul(q_nope, w_uk, transpose_y=True).transpose([1, 0, 2])  # [T, nh, L]
        q_cat = paddle.concat([q_lat, q[..., s.qk_nope_head_dim :]], axis=-1)  # [T, nh, L + R]
        scores = paddle.matmul(q_cat, latents, transpose_y=True).unsqueeze(2)  # [T, nh, 1, span]
        probs = F.softmax(paddle.where(visible, scores, minus_inf()), axis=-1).squeeze(2)
        out_lat = paddle.matmul(probs, latents[..., : s.kv_lora_rank])  # [T, nh, L]
        out = paddle.matmul(out_lat.transpose([1, 0, 2]), w_uv)  # [nh, T, v]
        return out.transpose([1, 0, 2]).reshape([t, s.num_heads, 1, s.v_head_dim])

    def _write(self, cache: paddle.Tensor, latent: paddle.Tensor, plan: AttentionPlan) -> None:
        """Store ``latent [T, latent_dim]`` at each row's slot in place (padding rows repeat the
        last real row; with no real row every slot gets its own value back)."""
        value = paddle.gather(latent, plan.write_rows)
        if value.dtype != cache.dtype:
            value = value.astype(cache.dtype)
        heads = paddle.zeros_like(plan.write_blocks)
        index = (plan.write_blocks, heads, plan.write_offsets)
        held = paddle.gather_nd(cache, paddle.stack(list(index), axis=-1))  # [T, latent_dim]
        paddle.index_put_(cache, index, paddle.where(plan.any_valid, value, held))

    def _read(self, cache: paddle.Tensor, plan: AttentionPlan) -> paddle.Tensor:
        """Every item's positions ``0 .. span - 1``: ``[B, span, latent_dim]`` float32."""
        rows = cache.reshape([-1, self.block_size, self.shape.latent_dim])
        got = paddle.gather(rows, plan.item_blocks.reshape([-1]))
        got = got.reshape([plan.num_items, plan.span, self.shape.latent_dim])
        return got if got.dtype == paddle.float32 else got.astype("float32")

    def _rebuild(
        self, latents: paddle.Tensor, kv_b_weight: paddle.Tensor, items: int, span: int
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """(``kv_b_weight`` float32.) Keys ``[B, nh, span, qk_head_dim]`` and values ``[B, nh,
        span, v_head_dim]`` from
        latents ``[B, span, latent_dim]``: ``[c W_uk ; k_pe]`` and ``c W_uv`` per head."""
        s = self.shape
        c, k_pe = latents[..., : s.kv_lora_rank], latents[..., s.kv_lora_rank :]
        kv = paddle.matmul(c, kv_b_weight).reshape(
            [items, span, s.num_heads, s.qk_nope_head_dim + s.v_head_dim]
        )
        k_nope, v = kv[..., : s.qk_nope_head_dim], kv[..., s.qk_nope_head_dim :]
        k_pe = k_pe.unsqueeze(2).expand([items, span, s.num_heads, s.qk_rope_head_dim])
        keys = paddle.concat([k_nope, k_pe], axis=-1).transpose([0, 2, 1, 3])
        return keys, v.transpose([0, 2, 1, 3])
