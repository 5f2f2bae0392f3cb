"""Building blocks shared by the target model and the MTP layer: RMSNorm, RoPE,
grouped-query attention, SwiGLU MLP, and the pre-norm decoder layer.

Every Linear has no bias (q/k/v may, see ``attention_bias``) and stores its weight in Paddle's
``[in, out]`` layout. With ``tensor_parallel_size > 1`` a block holds one rank's shard:
attention heads and MLP features are split over the ranks (q/k/v, gate/up column-parallel;
o_proj, down row-parallel with a sum over the ranks), see
:mod:`~fastdeploy_mtp.models.parallel_layers`.
Each block has two entry points: ``forward`` on a packed ``[T, H]`` batch with the paged
attention backend (serving), and ``forward_dense`` on ``[B, S, H]`` full sequences with a
causal mask (training). They share parameters and math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle
import paddle.nn as nn

from .attention import ReferenceAttentionBackend
from .dense_attention import dense_causal_attention
from .forward_meta import ForwardMeta
from .latent_attention import LatentAttentionBackend
from .model_config import ModelConfig
from .moe import MoEMLP
from .parallel_layers import ColumnParallelLinear, RowParallelLinear, check_tensor_parallel
from .rope import RopeSpec, rope_tables
from .swiglu import SwiGLUMLP


class RMSNorm(nn.Layer):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last axis; weight ``[H]`` in the
    default dtype at construction (the model's ``dtype``). The statistics are computed in
    float32 and the normalised input is cast back to ``x``'s dtype before the scale."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter(
            [hidden_size],
            dtype=paddle.get_default_dtype(),
            default_initializer=nn.initializer.Constant(1.0),
        )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if x.dtype == paddle.float32:
            variance = paddle.mean(x * x, axis=-1, keepdim=True)
            return x * paddle.rsqrt(variance + self.eps) * self.weight
        x32 = x.astype("float32")
        normed = x32 * paddle.rsqrt(paddle.mean(x32 * x32, axis=-1, keepdim=True) + self.eps)
        return normed.astype(x.dtype) * self.weight


class RotaryEmbedding(nn.Layer):
    """Precomputed RoPE cos/sin tables, "rotate half" layout, for base ``theta`` and a
    config's ``rope_scaling`` (see :mod:`~fastdeploy_mtp.models.rope`; :meth:`of` builds
    one from a :class:`ModelConfig`).

    ``cos[p, i] = a * cos(p * inv_freq[i mod d/2])`` for ``p < max_position_embeddings`` and
    ``i < d`` (``d = head_dim`` here: the rotated width, which :meth:`of` makes
    ``head_dim * partial_rotary_factor``; ``a`` = the scaling's attention factor, 1 except for
    yarn); likewise ``sin``. The tables are float32 buffers that are not saved.
    """

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        theta: float,
        rope_scaling: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.max_position = max_position
        cos, sin = rope_tables(RopeSpec(head_dim, max_position, theta, rope_scaling))
        self.register_buffer("cos_table", paddle.to_tensor(cos, dtype="float32"), persistable=False)
        self.register_buffer("sin_table", paddle.to_tensor(sin, dtype="float32"), persistable=False)

    @classmethod
    def of(cls, config: ModelConfig) -> RotaryEmbedding:
        """The tables of ``config`` (``max_position_embeddings``, ``rope_theta``,
        ``rope_scaling``) over its rotated width ``head_dim * partial_rotary_factor`` (GLM-4.5
        rotates the first half of each head, as transformers' Glm4Moe does; every other
        family the whole head)."""
        rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        return cls(
            rotary_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )

    def lookup(
        self, positions: np.ndarray | paddle.Tensor, check: bool = True
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """``positions`` ``[T]`` ints -> ``(cos, sin)`` each ``[T, d]`` float32 (``d`` the
        rotated width).

        ``positions`` may be a numpy array (always checked against ``max_position``) or an
        integer ``paddle.Tensor``, gathered on its device. A tensor is checked only when
        ``check`` is set (a host read); otherwise positions past the table are clamped to its
        last row instead of read out of bounds.

        Raises:
            ValueError: a checked position is ``>= max_position_embeddings``.
        """
        if not isinstance(positions, paddle.Tensor):
            positions = np.asarray(positions, dtype=np.int64)
            if positions.size and int(positions.max()) >= self.max_position:
                raise ValueError(
                    f"position {int(positions.max())} is beyond `max_position_embeddings` "
                    f"({self.max_position})"
                )
            idx = paddle.to_tensor(positions)
        else:
            idx = (
                positions
                if positions.dtype in (paddle.int32, paddle.int64)
                else positions.astype("int64")
            )
            idx = idx if len(idx.shape) == 1 else idx.reshape([-1])
            if check and idx.shape[0] > 0:
                self.check_position(int(idx.max().item()))
            idx = paddle.clip(idx, 0, self.max_position - 1)
        return (paddle.gather(self.cos_table, idx), paddle.gather(self.sin_table, idx))

    def check_position(self, largest: int) -> None:
        """Raise the ``ValueError`` of :meth:`lookup` when position ``largest`` (a host int)
        is past the table."""
        if largest >= self.max_position:
            raise ValueError(
                f"position {largest} is beyond `max_position_embeddings` ({self.max_position})"
            )

    def prefix(self, seq_len: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        """``(cos, sin)`` for positions ``0 .. seq_len - 1``, each ``[seq_len, d]``."""
        if seq_len > self.max_position:
            raise ValueError(
                f"`seq_len` {seq_len} exceeds `max_position_embeddings` ({self.max_position})"
            )
        return self.cos_table[:seq_len], self.sin_table[:seq_len]


def apply_rope(
    x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor, interleave: bool = False
) -> paddle.Tensor:
    """Rotate ``x [..., S, heads, head_dim]`` by ``cos/sin [S, d]`` (rotate-half within the
    first ``d <= head_dim`` dimensions of each head; the other ``head_dim - d`` pass through
    unchanged, GLM-4.5's partial rotary).

    ``interleave`` (ERNIE-4.5, ``config.rope_interleave``; whole heads only): the rotated pairs
    are ``(x[2i], x[2i+1])`` at frequency ``i`` (GPT-J style). The result is returned
    de-interleaved, ``[x_even * c - x_odd * s, x_odd * c + x_even * s]``: the interleaved
    rotation followed by one fixed permutation of the head's dimensions. Queries and keys get
    the same permutation, so every ``q . k`` (and the attention output, values being
    unrotated) is the interleaved model's exactly; the key cache holds keys in this order."""
    if cos.dtype != x.dtype:
        cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    if interleave:
        x = paddle.concat([x[..., 0::2], x[..., 1::2]], axis=-1)
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        return paddle.concat([apply_rope(rot, cos, sin), rest], axis=-1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = paddle.concat([-x2, x1], axis=-1)
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    return x * cos + rotated * sin


@dataclass(frozen=True)
class PagedStep:
    """What every layer's attention reads in one packed forward pass besides its input:
    ``cos/sin [T, d]`` float32 (RoPE at the packed tokens' positions, ``d`` the rotated width),
    the paged attention backend (a latent one for MLA layers) and the step's
    :class:`ForwardMeta`."""

    cos: paddle.Tensor
    sin: paddle.Tensor
    backend: ReferenceAttentionBackend | LatentAttentionBackend
    forward_meta: ForwardMeta


@dataclass(frozen=True)
class DenseStep:
    """What every layer's attention reads on the dense (training) path besides its input:
    ``cos/sin [S, d]`` float32 (RoPE at positions ``0..S-1``, ``d`` the rotated width) and the
    additive mask
    ``bias [S, S']`` float32 (``S' = S`` and causal over the inputs' own keys)."""

    cos: paddle.Tensor
    sin: paddle.Tensor
    bias: paddle.Tensor


#: ``(keys, values)`` of :meth:`Attention.dense_kv`, each ``[B, num_kv_heads, S', head_dim]``.
DenseKV = tuple[paddle.Tensor, paddle.Tensor]


class Attention(nn.Layer):
    """Grouped-query self-attention: ``q_proj [H, nh*hd]``, ``k_proj``/``v_proj``
    ``[H, kvh*hd]``, ``o_proj [nh*hd, H]``; RoPE on q and k. ``q/k/v_proj`` carry biases
    only when ``config.attention_bias`` is set; with ``config.qk_norm`` (Qwen3) each query and
    key head is RMS-normalised by ``q_norm``/``k_norm`` (weights ``[head_dim]``) before RoPE.

    With ``tensor_parallel_size = tp`` this rank holds ``nh/tp`` query heads and ``kvh/tp``
    key/value heads (a contiguous run of heads, so each local query head still reads its own
    group's key/value head), and ``o_proj`` sums the ranks' partial outputs. With
    ``config.rope_interleave`` (ERNIE-4.5) RoPE rotates interleaved pairs (:func:`apply_rope`)."""

    def __init__(self, config: ModelConfig, tensor_parallel_size: int = 1):
        super().__init__()
        check_tensor_parallel(config, tensor_parallel_size)
        self.num_heads = config.num_attention_heads // tensor_parallel_size
        self.num_kv_heads = config.num_key_value_heads // tensor_parallel_size
        self.head_dim = config.head_dim
        h = config.hidden_size
        tp = tensor_parallel_size
        qkv_bias = None if config.attention_bias else False
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self.q_proj = ColumnParallelLinear(
            h, config.num_attention_heads * self.head_dim, tp, bias_attr=qkv_bias
        )
        self.k_proj = ColumnParallelLinear(
            h, config.num_key_value_heads * self.head_dim, tp, bias_attr=qkv_bias
        )
        self.v_proj = ColumnParallelLinear(
            h, config.num_key_value_heads * self.head_dim, tp, bias_attr=qkv_bias
        )
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, h, tp)
        self.scale = 1.0 / float(np.sqrt(self.head_dim))
        self.interleave = config.rope_interleave  # ERNIE-4.5's GPT-J pairs (see apply_rope)

    def _norm_q(self, q: paddle.Tensor) -> paddle.Tensor:
        """Per-head RMSNorm of queries ``[..., heads, head_dim]`` (``qk_norm``), else ``q``."""
        return self.q_norm(q) if self.qk_norm else q

    def _norm_k(self, k: paddle.Tensor) -> paddle.Tensor:
        """Per-head RMSNorm of keys ``[..., kv_heads, head_dim]`` (``qk_norm``), else ``k``."""
        return self.k_norm(k) if self.qk_norm else k

    def forward(self, x: paddle.Tensor, step: PagedStep, layer_id: int) -> paddle.Tensor:
        """``x [T, H]`` -> ``[T, H]`` through the paged backend (whose caches hold this rank's
        ``num_kv_heads`` heads); ``layer_id`` selects the KV cache pair."""
        t = x.shape[0]
        q = self._norm_q(self.q_proj(x).reshape([t, self.num_heads, self.head_dim]))
        k = self._norm_k(self.k_proj(x).reshape([t, self.num_kv_heads, self.head_dim]))
        v = self.v_proj(x).reshape([t, self.num_kv_heads, self.head_dim])
        q = apply_rope(q, step.cos, step.sin, self.interleave)
        k = apply_rope(k, step.cos, step.sin, self.interleave)
        return self.o_proj(step.backend.forward(q, k, v, layer_id, step.forward_meta))

    def dense_kv(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> DenseKV:
        """Keys (RoPE applied) and values ``[B, num_kv_heads, S, head_dim]`` of ``x [B, S, H]``."""
        b, s = x.shape[0], x.shape[1]
        k = self._norm_k(self.k_proj(x).reshape([b, s, self.num_kv_heads, self.head_dim]))
        k = apply_rope(k, cos, sin, self.interleave)
        v = self.v_proj(x).reshape([b, s, self.num_kv_heads, self.head_dim])
        return k.transpose([0, 2, 1, 3]), v.transpose([0, 2, 1, 3])

    def forward_dense(
        self, x: paddle.Tensor, step: DenseStep, kv: DenseKV | None = None
    ) -> paddle.Tensor:
        """``x [B, S, H]`` -> ``[B, S, H]``.
        The queries attend to ``x``'s own keys and values (``S' = S``, causal ``bias``), or to
        ``kv`` (``S'`` rows from :meth:`dense_kv` of other inputs, e.g. the MTP layer's
        earlier substeps, under a mask that says which each query sees)."""
        b, s = x.shape[0], x.shape[1]
        q = self._norm_q(self.q_proj(x).reshape([b, s, self.num_heads, self.head_dim]))
        q = apply_rope(q, step.cos, step.sin, self.interleave)
        k, v = self.dense_kv(x, step.cos, step.sin) if kv is None else kv
        out = dense_causal_attention(q.transpose([0, 2, 1, 3]), k, v, step.bias, self.scale)
        return self.o_proj(out)


class DecoderLayer(nn.Layer):
    """Pre-norm block: ``h = x + attn(input_layernorm(x))``,
    ``out = h + mlp(post_attention_layernorm(h))``. Norms are replicated; attention and MLP
    are split over ``tensor_parallel_size`` ranks (input and output ``[T, H]`` replicated).
    ``attention``: the ``self_attn`` module (e.g. :func:`~fastdeploy_mtp.models.mla.attention_for`'s
    MLA); ``None`` = grouped-query :class:`Attention`.

    ``layer_index`` is the block's place in the model (target layers ``0..N-1``, MTP layer
    ``k`` is ``N + k``): ``mlp`` is a :class:`~fastdeploy_mtp.models.moe.MoEMLP` when
    ``config.is_moe_layer(layer_index)``, else a dense :class:`SwiGLUMLP` of
    ``intermediate_size``."""

    def __init__(
        self,
        config: ModelConfig,
        tensor_parallel_size: int = 1,
        attention: nn.Layer | None = None,
        layer_index: int = 0,
    ):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, tensor_parallel_size) if attention is None else attention
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: SwiGLUMLP | MoEMLP
        if config.is_moe_layer(layer_index):
            self.mlp = MoEMLP(config, tensor_parallel_size)
        else:
            self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, tensor_parallel_size)

    def forward(self, x: paddle.Tensor, step: PagedStep, layer_id: int) -> paddle.Tensor:
        """Packed ``[T, H]`` -> ``[T, H]``; ``layer_id`` selects the KV cache pair."""
        h = x + self.self_attn(self.input_layernorm(x), step, layer_id)
        return h + self.mlp(self.post_attention_layernorm(h))

    def dense_kv(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> DenseKV:
        """The attention's keys and values of the block inputs ``x [B, S, H]``
        (:meth:`Attention.dense_kv` after ``input_layernorm``)."""
        return self.self_attn.dense_kv(self.input_layernorm(x), cos, sin)

    def forward_dense(
        self, x: paddle.Tensor, step: DenseStep, kv: DenseKV | None = None
    ) -> paddle.Tensor:
        """Full sequences ``[B, S, H]`` -> ``[B, S, H]`` with a causal ``step.bias [S, S]``, or
        attending to ``kv`` from :meth:`dense_kv` under ``step.bias [S, S']`` (see
        :meth:`Attention.forward_dense`)."""
        h = x + self.self_attn.forward_dense(self.input_layernorm(x), step, kv)
        return h + self.mlp.forward_dense(self.post_attention_layernorm(h))
