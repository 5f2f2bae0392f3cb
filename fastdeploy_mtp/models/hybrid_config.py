"""The hybrid-attention part of a model's shape (Qwen3-Next, Qwen3.5): which decoder layers
are Gated DeltaNet (linear attention) and which gated full attention, the linear layers'
heads and convolution, the MoE placement and the shared expert, read from ``config.json``.

:class:`HybridSpec` is :attr:`ModelConfig.hybrid
<fastdeploy_mtp.models.model_config.ModelConfig.hybrid>`; :func:`hybrid_fields` translates a
``qwen3_next`` / ``qwen3_5_text`` ``config.json`` object into the :class:`ModelConfig` fields
(this spec, the partial rotary factor, the MoE router, the MTP layer count). Refusals are
``ValueError`` with one line naming the key; the caller adds the folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config.validators import flag, given, integer

LINEAR = "linear_attention"
FULL = "full_attention"
#: ``model_type`` of the hybrid families.
HYBRID_FAMILIES = ("qwen3_next", "qwen3_5_text")


@dataclass(frozen=True)
class HybridSpec:
    """Attributes:
    layer_types: per target layer, ``"linear_attention"`` or ``"full_attention"``.
    linear_num_key_heads, linear_num_value_heads: query/key and value heads of a Gated
        DeltaNet layer (each query/key head serves ``value / key`` consecutive value heads).
    linear_key_head_dim, linear_value_head_dim: their widths.
    linear_conv_kernel_dim: the causal depthwise convolution's kernel ``K`` (its state keeps
        the last ``K - 1`` inputs).
    fused_projections: Qwen3-Next's ``in_proj_qkvz`` / ``in_proj_ba``, grouped per key head;
        else Qwen3.5's ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``.
    shared_expert_intermediate_size: width of the MoE block's shared expert, scaled per token
        by ``sigmoid(shared_expert_gate(x))`` (0 = none).
    decoder_sparse_step, mlp_only_layers: layer ``i`` has the MoE block iff it is not in
        ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (MTP layer ``k``
        counts as ``i = k``, as vLLM builds it from its name ``mtp.layers.{k}``).
    """

    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    fused_projections: bool
    shared_expert_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = field(default_factory=tuple)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: queries, keys and values (``2 key_dim + value_dim``)."""
        return 2 * self.key_dim + self.value_dim

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (counted as the module doc says) has the MoE block,
        given that the model has experts."""
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    def state_indices(self) -> list[int]:
        """Per target layer, its place among the layers of its kind: a full-attention layer's
        key/value cache pair (``caches[2j], caches[2j + 1]``), a linear layer's entry in
        :class:`~fastdeploy_mtp.models.linear_state.LinearStates`."""
        seen = {LINEAR: 0, FULL: 0}
        out = []
        for kind in self.layer_types:
            out.append(seen[kind])
            seen[kind] += 1
        return out

    @property
    def num_linear_layers(self) -> int:
        return sum(kind == LINEAR for kind in self.layer_types)

    def state_shapes(
        self, tensor_parallel_size: int = 1
    ) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """``(conv_shape, recurrent_shape)`` of one linear layer's state on one of
        ``tensor_parallel_size`` ranks: ``(conv_dim / tp, K - 1)`` and ``(value_heads / tp,
        key_head_dim, value_head_dim)``, laid out per slot by :func:`~.linear_state.state_specs`."""
        tp = tensor_parallel_size
        return (
            (self.conv_dim // tp, self.linear_conv_kernel_dim - 1),
            (
                self.linear_num_value_heads // tp,
                self.linear_key_head_dim,
                self.linear_value_head_dim,
            ),
        )

    def check_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Raise ``ValueError`` when ``tensor_parallel_size`` does not divide the linear
        layers' key heads (value heads are a multiple of them)."""
        if self.linear_num_key_heads % tensor_parallel_size != 0:
            raise ValueError(
                f"`linear_num_key_heads` ({self.linear_num_key_heads}) is not divisible by "
                f"`tensor_parallel_size` ({tensor_parallel_size})"
            )


def _int(raw: dict[str, Any], key: str, default: int | None, minimum: int = 1) -> int:
    value = given(raw, key, default)
    if value is None:
        raise ValueError(f"config.json has no `{key}`")
    return integer(value, f"config.json `{key}`", minimum)


def _layer_types(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    """``layer_types``, or every ``full_attention_interval``-th layer full (default 4)."""
    types = raw.get("layer_types")
    if types is None:
        interval = _int(raw, "full_attention_interval", 4)
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers))
    if not isinstance(types, list) or len(types) != layers:
        raise ValueError(f"config.json `layer_types` must be a list of {layers} layer types")
    unknown = [t for t in types if t not in (LINEAR, FULL)]
    if unknown:
        raise ValueError(
            f"config.json `layer_types` has {unknown[0]!r}; supported: {[LINEAR, FULL]}"
        )
    return tuple(types)


def _partial_rotary(raw: dict[str, Any]) -> float:
    rope = raw.get("rope_parameters")
    rope = rope if isinstance(rope, dict) else raw.get("rope_scaling") or {}
    factor = rope.get("partial_rotary_factor", given(raw, "partial_rotary_factor", 0.25))
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise ValueError(
            f"config.json `partial_rotary_factor` must be a number in (0, 1], got {factor!r}"
        )
    return float(factor)


def hybrid_fields(raw: dict[str, Any], family: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of a ``qwen3_next`` / ``qwen3_5_text`` ``config.json``
    object ``raw``: ``hybrid``, ``qk_norm`` (always), ``partial_rotary_factor`` (0.25 when
    absent), the MoE router (``num_experts`` softmax top-``num_experts_per_tok``, greedy,
    ``norm_topk_prob``) and ``num_nextn_predict_layers`` (Qwen3-Next: that key, 1 when
    absent as vLLM assumes; Qwen3.5: ``mtp_num_hidden_layers``, 0 when absent)."""
    layers = _int(raw, "num_hidden_layers", None, 0)
    if flag(given(raw, "attention_bias", False), "config.json `attention_bias`"):
        raise ValueError(
            "config.json `attention_bias` true is not supported (the hybrid families' "
            "projections have no bias)"
        )
    experts = _int(raw, "num_experts", 0, 0) if family == "qwen3_next" else 0
    kv_heads = _int(raw, "linear_num_key_heads", 16)
    v_heads = _int(raw, "linear_num_value_heads", 32)
    if v_heads % kv_heads != 0:
        raise ValueError(
            f"config.json `linear_num_value_heads` ({v_heads}) must be a multiple of "
            f"`linear_num_key_heads` ({kv_heads})"
        )
    mlp_only = given(raw, "mlp_only_layers", [])
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise ValueError("config.json `mlp_only_layers` must be a list of layer indices")
    spec = HybridSpec(
        layer_types=_layer_types(raw, layers),
        linear_num_key_heads=kv_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=_int(raw, "linear_key_head_dim", 128),
        linear_value_head_dim=_int(raw, "linear_value_head_dim", 128),
        linear_conv_kernel_dim=_int(raw, "linear_conv_kernel_dim", 4, 2),
        fused_projections=family == "qwen3_next",
        shared_expert_intermediate_size=(
            _int(raw, "shared_expert_intermediate_size", 0, 0) if experts else 0
        ),
        decoder_sparse_step=_int(raw, "decoder_sparse_step", 1),
        mlp_only_layers=tuple(mlp_only),
    )
    mtp_key = "num_nextn_predict_layers" if family == "qwen3_next" else "mtp_num_hidden_layers"
    fields: dict[str, Any] = {
        "hybrid": spec,
        "qk_norm": True,
        "partial_rotary_factor": _partial_rotary(raw),
        "num_nextn_predict_layers": _int(raw, mtp_key, 1 if family == "qwen3_next" else 0, 0),
    }
    if experts:
        fields.update(
            n_routed_experts=experts,
            num_experts_per_tok=_int(raw, "num_experts_per_tok", 10),
            moe_intermediate_size=_int(raw, "moe_intermediate_size", 512),
            norm_topk_prob=flag(given(raw, "norm_topk_prob", True), "config.json `norm_topk_prob`"),
            scoring_func="softmax",
            topk_method="greedy",
            n_shared_experts=0,
            routed_scaling_factor=1.0,
        )
        if fields["num_experts_per_tok"] > experts:
            raise ValueError(
                f"config.json `num_experts_per_tok` ({fields['num_experts_per_tok']}) must be "
                f"<= `num_experts` ({experts})"
            )
    return fields
