"""The decoder blocks of the hybrid-attention families (Qwen3-Next, Qwen3.5), and the two
factories every model builds its blocks and norms with (:func:`decoder_block`,
:func:`norm_for`), so that the target and the MTP layer of any family are the same code.

A hybrid block (:class:`HybridDecoderLayer`) is pre-norm like the dense one, with
zero-centred RMSNorms (``x_normed * (1 + w)``), and mixes tokens either with a Gated DeltaNet
(:mod:`~fastdeploy_mtp.models.gated_deltanet`) or with gated full attention
(:class:`GatedAttention`); its MLP is dense SwiGLU or the sparse MoE with a gated shared
expert (:class:`SharedExpertMoE`).
"""

from __future__ import annotations

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .. import distributed
from .gated_deltanet import GatedDeltaNet
from .hybrid_config import FULL, LINEAR
from .layers import DecoderLayer, PagedStep, RMSNorm, apply_rope
from .mla import attention_for
from .model_config import ModelConfig
from .moe import ExpertMLP, MoEMLP
from .parallel_layers import ColumnParallelLinear, RowParallelLinear, check_tensor_parallel
from .swiglu import SwiGLUMLP


class ZeroCentredRMSNorm(RMSNorm):
    """``x / sqrt(mean(x^2) + eps) * (1 + weight)`` in float32, cast back to ``x``'s dtype
    (Qwen3-Next / Qwen3.5 store the weight centred on 0; it starts at 0)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__(hidden_size, eps)
        self.weight.set_value(paddle.zeros_like(self.weight))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x32 = x.astype("float32")
        normed = x32 * paddle.rsqrt(paddle.mean(x32 * x32, axis=-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.astype("float32"))).astype(x.dtype)


def norm_for(config: ModelConfig, size: int) -> RMSNorm:
    """An RMSNorm of ``size`` for ``config``'s family: zero-centred for the hybrid ones."""
    if config.hybrid is not None:
        return ZeroCentredRMSNorm(size, config.rms_norm_eps)
    return RMSNorm(size, config.rms_norm_eps)


class GatedAttention(nn.Layer):
    """Full attention with an output gate: ``q_proj [H, nh * 2 hd]`` gives per head its query
    and then its gate (head-interleaved, as transformers splits them), ``k_proj``/``v_proj``
    ``[H, kvh * hd]``, zero-centred per-head ``q_norm``/``k_norm`` before the (partial)
    RoPE, and ``o_proj(attention * sigmoid(gate))``. Tensor parallelism splits heads (each
    head's query and gate travel together)."""

    def __init__(self, config: ModelConfig, tensor_parallel_size: int = 1):
        super().__init__()
        check_tensor_parallel(config, tensor_parallel_size)
        tp, h, hd = tensor_parallel_size, config.hidden_size, config.head_dim
        self.num_heads = config.num_attention_heads // tp
        self.num_kv_heads = config.num_key_value_heads // tp
        self.head_dim = hd
        self.q_proj = ColumnParallelLinear(h, config.num_attention_heads * hd * 2, tp)
        self.k_proj = ColumnParallelLinear(h, config.num_key_value_heads * hd, tp)
        self.v_proj = ColumnParallelLinear(h, config.num_key_value_heads * hd, tp)
        self.o_proj = RowParallelLinear(config.num_attention_heads * hd, h, tp)
        self.q_norm = ZeroCentredRMSNorm(hd, config.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(hd, config.rms_norm_eps)

    def forward(self, x: paddle.Tensor, step: PagedStep, layer_id: int) -> paddle.Tensor:
        """``x [T, H]`` -> ``[T, H]``; ``layer_id`` selects the key/value cache pair."""
        t, hd = int(x.shape[0]), self.head_dim
        query_gate = self.q_proj(x).reshape([t, self.num_heads, 2 * hd])
        q = self.q_norm(query_gate[..., :hd])
        gate = query_gate[..., hd:].reshape([t, self.num_heads * hd])
        k = self.k_norm(self.k_proj(x).reshape([t, self.num_kv_heads, hd]))
        v = self.v_proj(x).reshape([t, self.num_kv_heads, hd])
        q, k = apply_rope(q, step.cos, step.sin), apply_rope(k, step.cos, step.sin)
        out = step.backend.forward(q, k, v, layer_id, step.forward_meta)
        return self.o_proj(out * F.sigmoid(gate))


class SharedExpertMoE(MoEMLP):
    """Qwen3-Next's sparse block: the softmax top-k router and experts of :class:`MoEMLP`
    (``greedy``, ``norm_topk_prob``), plus ``shared_expert`` (a SwiGLU of
    ``hybrid.shared_expert_intermediate_size``) scaled per token by
    ``sigmoid(shared_expert_gate(x))`` (``[H, 1]``, replicated). Under tensor parallelism the
    shared expert is split like the others and the partial sums are reduced once."""

    def __init__(self, config: ModelConfig, tensor_parallel_size: int = 1):
        super().__init__(config, tensor_parallel_size)
        assert config.hybrid is not None
        size, h = config.hybrid.shared_expert_intermediate_size, config.hidden_size
        self.shared_expert = ExpertMLP(h, size, tensor_parallel_size) if size else None
        self.shared_expert_gate = nn.Linear(h, 1, bias_attr=False) if size else None

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """Packed ``x [T, H]`` -> ``[T, H]`` in ``x``'s dtype."""
        if x.shape[0] == 0:
            return paddle.zeros_like(x)
        weights, indices = self.gate(x)
        out = self._routed(x, weights, indices)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            scale = F.sigmoid(self.shared_expert_gate(x).astype("float32"))
            out = out + scale * self.shared_expert(x).astype("float32")
        if self.tensor_parallel_size > 1:
            out = distributed.all_reduce_sum(out)
        return out.astype(x.dtype)


class HybridDecoderLayer(nn.Layer):
    """``h = x + mixer(input_layernorm(x))``, ``out = h + mlp(post_attention_layernorm(h))``;
    ``kind`` ``"linear_attention"`` (``linear_attn``: :class:`GatedDeltaNet`) or
    ``"full_attention"`` (``self_attn``: :class:`GatedAttention`). ``layer_index`` decides
    the MLP (``config.is_moe_layer``)."""

    def __init__(self, config: ModelConfig, tensor_parallel_size: int, kind: str, layer_index: int):
        super().__init__()
        tp, h = tensor_parallel_size, config.hidden_size
        self.kind = kind
        self.input_layernorm = ZeroCentredRMSNorm(h, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(h, config.rms_norm_eps)
        if kind == LINEAR:
            self.linear_attn = GatedDeltaNet(config, tp)
        else:
            self.self_attn = GatedAttention(config, tp)
        self.mlp: SharedExpertMoE | SwiGLUMLP
        if config.is_moe_layer(layer_index):
            self.mlp = SharedExpertMoE(config, tp)
        else:
            self.mlp = SwiGLUMLP(h, config.intermediate_size, tp)

    def forward(self, x: paddle.Tensor, step: PagedStep, layer_id: int) -> paddle.Tensor:
        """Packed ``[T, H]`` -> ``[T, H]``; ``layer_id`` is the layer's key/value cache pair
        (full attention) or its entry in ``forward_meta.linear_states`` (linear)."""
        y = self.input_layernorm(x)
        if self.kind == LINEAR:
            y = self.linear_attn(y, step.forward_meta, layer_id)
        else:
            y = self.self_attn(y, step, layer_id)
        h = x + y
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_dense(self, *args: object) -> paddle.Tensor:
        """Not available: the training path covers the dense families only."""
        raise NotImplementedError(
            "forward_dense (training) is not implemented for hybrid-attention layers"
        )


def decoder_block(
    config: ModelConfig, tensor_parallel_size: int, layer_index: int
) -> DecoderLayer | HybridDecoderLayer:
    """Decoder layer ``layer_index`` of ``config`` (MTP layer ``k`` is ``num_hidden_layers +
    k``; a hybrid family's MTP block is a full-attention layer)."""
    if config.hybrid is None:
        attention = attention_for(config, tensor_parallel_size)
        return DecoderLayer(config, tensor_parallel_size, attention, layer_index)
    types = config.hybrid.layer_types
    kind = types[layer_index] if layer_index < len(types) else FULL
    return HybridDecoderLayer(config, tensor_parallel_size, kind, layer_index)
