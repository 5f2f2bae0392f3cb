"""DeepSeek-V3's multi-head latent attention (MLA) and the choice between it and GQA.

Weights (Paddle ``[in, out]`` layout; checkpoints hold torch's ``[out, in]``), with ``nh``
heads, ``qk = qk_nope_head_dim + qk_rope_head_dim``, ``L = kv_lora_rank``, ``R =
qk_rope_head_dim``:

- queries: ``q_a_proj [H, q_lora_rank]`` -> ``q_a_layernorm`` -> ``q_b_proj [q_lora_rank,
  nh*qk]``, or a plain ``q_proj [H, nh*qk]`` when ``q_lora_rank`` is 0;
- ``kv_a_proj_with_mqa [H, L + R]``: the compressed key/value ``c_kv`` (normed by
  ``kv_a_layernorm [L]``) and the key's rope part ``k_pe``, one for all heads;
- ``kv_b_proj [L, nh*(qk_nope_head_dim + v_head_dim)]``: per head the key's no-rope part and
  the value, from ``c_kv``;
- ``o_proj [nh*v_head_dim, H]``.

RoPE rotates the last ``R`` values of each query head and ``k_pe``. DeepSeek checkpoints
rotate interleaved pairs ``(x0, x1), (x2, x3), ...`` and emit the rotated halves
de-interleaved (``config.rope_interleave``, transformers' default for the family); otherwise
the usual rotate-half layout. The softmax scale is ``1/sqrt(qk)``, times ``mscale**2`` with
``mscale = 0.1 * mscale_all_dim * ln(factor) + 1`` when ``rope_scaling`` has a non-zero
``mscale_all_dim`` (and ``factor > 1``). ``q_a_layernorm``/``kv_a_layernorm`` use epsilon
1e-6, as the family's reference code does whatever ``rms_norm_eps`` says.

Tensor parallelism splits the heads: ``q_b_proj``/``q_proj`` and ``kv_b_proj`` are
column-parallel by head, ``o_proj`` row-parallel; ``q_a_proj``, ``kv_a_proj_with_mqa`` and
the two norms are replicated, and so is the latent cache.
"""

from __future__ import annotations

import math

import paddle
import paddle.nn as nn

from .attention import ReferenceAttentionBackend
from .latent_attention import LatentAttentionBackend, LatentShape
from .layers import Attention, DenseKV, DenseStep, PagedStep, RMSNorm, apply_rope
from .model_config import ModelConfig
from .parallel_layers import ColumnParallelLinear, RowParallelLinear, check_tensor_parallel

#: Epsilon of ``q_a_layernorm`` and ``kv_a_layernorm`` (DeepSeek's code builds them without
#: passing ``rms_norm_eps``).
LATENT_NORM_EPS = 1e-6


def mla_scale(config: ModelConfig) -> float:
    """The softmax scale of ``config``'s MLA layers (see the module doc)."""
    scale = 1.0 / math.sqrt(config.qk_nope_head_dim + config.qk_rope_head_dim)
    rope = config.rope_scaling or {}
    all_dim = float(rope.get("mscale_all_dim") or 0.0)
    factor = float(rope.get("factor") or 1.0)
    if all_dim and factor > 1.0:
        mscale = 0.1 * all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


class MLAttention(nn.Layer):
    """Multi-head latent attention of one layer (see the module doc for the weights).

    ``forward`` runs a packed ``[T, H]`` batch through a :class:`LatentAttentionBackend`
    (layer ``layer_id``'s latent cache); ``forward_dense`` runs ``[B, S, H]`` full sequences
    with a causal mask. Both return ``[..., H]`` in the model dtype."""

    def __init__(self, config: ModelConfig, tensor_parallel_size: int = 1):
        super().__init__()
        check_tensor_parallel(config, tensor_parallel_size)
        tp = tensor_parallel_size
        h, nh = config.hidden_size, config.num_attention_heads
        self.num_heads = nh // tp
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.kv_lora_rank, self.v_head_dim = config.kv_lora_rank, config.v_head_dim
        self.interleave = config.rope_interleave
        qk = self.nope + self.rope
        self.q_lora_rank = config.q_lora_rank
        if self.q_lora_rank > 0:
            self.q_a_proj = nn.Linear(h, self.q_lora_rank, bias_attr=False)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, nh * qk, tp)
        else:
            self.q_proj = ColumnParallelLinear(h, nh * qk, tp)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_lora_rank + self.rope, bias_attr=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank, nh * (self.nope + self.v_head_dim), tp
        )
        self.o_proj = RowParallelLinear(nh * self.v_head_dim, h, tp)
        self.scale = mla_scale(config)

    def _queries(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        """``x [..., H]`` -> ``[..., nh, qk]`` with the rope part rotated."""
        if self.q_lora_rank > 0:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.reshape([*x.shape[:-1], self.num_heads, self.nope + self.rope])
        return paddle.concat(
            [q[..., : self.nope], apply_rope(q[..., self.nope :], cos, sin, self.interleave)], -1
        )

    def _latent(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        """``x [..., H]`` -> ``[..., kv_lora_rank + R]``: normed ``c_kv`` then roped ``k_pe``."""
        ckv = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(ckv[..., : self.kv_lora_rank])
        k_pe = apply_rope(
            ckv[..., self.kv_lora_rank :].unsqueeze(-2), cos, sin, self.interleave
        ).squeeze(-2)
        return paddle.concat([c, k_pe], axis=-1)

    def forward(self, x: paddle.Tensor, step: PagedStep, layer_id: int) -> paddle.Tensor:
        """``x [T, H]`` -> ``[T, H]``; ``step.cos/sin`` are ``[T, R]`` and ``step.backend`` a
        :class:`LatentAttentionBackend`; ``layer_id`` selects the latent cache."""
        backend = step.backend
        if not isinstance(backend, LatentAttentionBackend):
            raise TypeError(
                f"MLA attention needs a LatentAttentionBackend, got {type(backend).__name__}"
            )
        q, latent = self._queries(x, step.cos, step.sin), self._latent(x, step.cos, step.sin)
        out = backend.forward(q, latent, self.kv_b_proj.weight, layer_id, step.forward_meta)
        return self.o_proj(out)

    def dense_kv(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> DenseKV:
        """Keys ``[B, nh, S, qk]`` and values ``[B, nh, S, v_head_dim]`` of ``x [B, S, H]``."""
        b, s = int(x.shape[0]), int(x.shape[1])
        latent = self._latent(x, cos, sin)
        kv = self.kv_b_proj(latent[..., : self.kv_lora_rank]).reshape([b, s, self.num_heads, -1])
        k_pe = (
            latent[..., self.kv_lora_rank :].unsqueeze(2).expand([b, s, self.num_heads, self.rope])
        )
        keys = paddle.concat([kv[..., : self.nope], k_pe], axis=-1)
        return keys.transpose([0, 2, 1, 3]), kv[..., self.nope :].transpose([0, 2, 1, 3])

    def forward_dense(
        self, x: paddle.Tensor, step: DenseStep, kv: DenseKV | None = None
    ) -> paddle.Tensor:
        """``x [B, S, H]`` -> ``[B, S, H]`` attending to its own keys under the causal
        ``step.bias [S, S]``, or to ``kv`` (from :meth:`dense_kv`) under ``step.bias [S, S']``."""
        b, s = int(x.shape[0]), int(x.shape[1])
        q = self._queries(x, step.cos, step.sin).transpose([0, 2, 1, 3])  # [B, nh, S, qk]
        keys, values = self.dense_kv(x, step.cos, step.sin) if kv is None else kv
        scores = (
            paddle.matmul(q, keys, transpose_y=True) * self.scale
            + step.bias[:s, : int(keys.shape[2])]
        )
        out = paddle.matmul(nn.functional.softmax(scores, axis=-1), values)  # [B, nh, S, v]
        return self.o_proj(
            out.transpose([0, 2, 1, 3]).reshape([b, s, self.num_heads * self.v_head_dim])
        )


def attention_for(config: ModelConfig, tensor_parallel_size: int = 1) -> Attention | MLAttention:
    """The ``self_attn`` of a decoder layer of ``config``: :class:`MLAttention` for
    ``attention_type == "mla"``, else grouped-query :class:`~.layers.Attention`."""
    if config.attention_type == "mla":
        return MLAttention(config, tensor_parallel_size)
    return Attention(config, tensor_parallel_size)


def attention_backend(
    config: ModelConfig, tensor_parallel_size: int = 1
) -> ReferenceAttentionBackend | LatentAttentionBackend:
    """The paged backend of ``config``'s layers on one of ``tensor_parallel_size`` ranks: a
    latent cache per layer for MLA, a key and a value cache per layer otherwise."""
    tp = tensor_parallel_size
    if config.attention_type == "mla":
        shape = LatentShape(
            config.num_attention_heads // tp,
            config.kv_lora_rank,
            config.qk_nope_head_dim,
            config.qk_rope_head_dim,
            config.v_head_dim,
        )
        return LatentAttentionBackend(shape, config.block_size, mla_scale(config))
    return ReferenceAttentionBackend(
        config.num_attention_heads // tp,
        config.num_key_value_heads // tp,
        config.head_dim,
        config.block_size,
    )
