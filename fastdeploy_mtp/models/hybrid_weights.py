"""Which checkpoint tensor fills which parameter for the hybrid families (Qwen3-Next,
Qwen3.5), as their released HuggingFace folders name them.

Target: ``model.embed_tokens``, ``model.layers.{i}.{input_layernorm, post_attention_layernorm}``,
then per layer either ``linear_attn.*`` (Gated DeltaNet: Qwen3-Next ``in_proj_qkvz``,
``in_proj_ba``; Qwen3.5 ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``; both
``conv1d.weight [C, 1, K]``, ``dt_bias``, ``A_log``, ``norm.weight``, ``out_proj``) or
``self_attn.{q,k,v,o}_proj`` + ``self_attn.{q,k}_norm``; the MLP ``mlp.{gate,up,down}_proj``
or ``mlp.gate``, ``mlp.experts.{e}.*``, ``mlp.shared_expert.*``, ``mlp.shared_expert_gate``;
``model.norm``, ``lm_head`` (absent when tied).

MTP layers (:data:`~fastdeploy_mtp.models.checkpoint_families.FAMILIES` ``"qwen3_next"``):
``mtp.pre_fc_norm_embedding`` (enorm), ``mtp.pre_fc_norm_hidden`` (hnorm), ``mtp.fc`` (eh_proj
``[H, 2H]``, input ``cat[enorm(e), hnorm(h)]``), ``mtp.norm`` and the full-attention block
``mtp.layers.{k}.<block>``. The fusion tensors are shared by every MTP layer (vLLM's layout),
so with several layers each of ours reads the same ones.
"""

from __future__ import annotations

from .checkpoint_families import FAMILIES
from .hybrid_config import FULL, LINEAR
from .model_config import ModelConfig
from .weight_refs import WeightRef, moe_refs, swiglu_refs


def _linear_refs(config: ModelConfig, owner: str, ours: str, ckpt: str) -> list[WeightRef]:
    spec = config.hybrid
    assert spec is not None
    h, kd, vd, nv = config.hidden_size, spec.key_dim, spec.value_dim, spec.linear_num_value_heads
    qkv_parts = (kd, kd, vd)
    mats: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = (
        [("in_proj_qkvz", (h, 2 * kd + 2 * vd), ()), ("in_proj_ba", (h, 2 * nv), ())]
        if spec.fused_projections
        else [
            ("in_proj_qkv", (h, spec.conv_dim), qkv_parts),
            ("in_proj_z", (h, vd), ()),
            ("in_proj_b", (h, nv), ()),
            ("in_proj_a", (h, nv), ()),
        ]
    )
    mats.append(("out_proj", (vd, h), ()))
    refs = [
        WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", shape, True, parts)
        for n, shape, parts in mats
    ]
    conv = (spec.conv_dim, 1, spec.linear_conv_kernel_dim)
    refs.append(
        WeightRef(owner, f"{ours}conv1d.weight", f"{ckpt}conv1d.weight", conv, False, qkv_parts)
    )
    for name, shape in (
        ("dt_bias", (nv,)),
        ("A_log", (nv,)),
        ("norm.weight", (spec.linear_value_head_dim,)),
    ):
        refs.append(WeightRef(owner, ours + name, ckpt + name, shape))
    return refs


def _attention_refs(config: ModelConfig, owner: str, ours: str, ckpt: str) -> list[WeightRef]:
    h, hd = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    shapes = (("q_proj", (h, 2 * q)), ("k_proj", (h, kv)), ("v_proj", (h, kv)), ("o_proj", (q, h)))
    refs = [
        WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", shape, True)
        for n, shape in shapes
    ]
    return refs + [
        WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", (hd,))
        for n in ("q_norm", "k_norm")
    ]


def hybrid_block_refs(
    config: ModelConfig, owner: str, ours: str, ckpt: str, kind: str, layer: int
) -> list[WeightRef]:
    """One :class:`~fastdeploy_mtp.models.hybrid_layers.HybridDecoderLayer` of ``kind`` at
    ``layer`` (MTP layer ``k`` = ``num_hidden_layers + k``)."""
    assert config.hybrid is not None
    h = config.hidden_size
    refs = [
        WeightRef(owner, ours + n, ckpt + n, (h,))
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight")
    ]
    if kind == LINEAR:
        refs += _linear_refs(config, owner, ours + "linear_attn.", ckpt + "linear_attn.")
    else:
        refs += _attention_refs(config, owner, ours + "self_attn.", ckpt + "self_attn.")
    mlp_ours, mlp_ckpt = ours + "mlp.", ckpt + "mlp."
    if not config.is_moe_layer(layer):
        return refs + swiglu_refs(h, config.intermediate_size, owner, mlp_ours, mlp_ckpt, True)
    refs += moe_refs(config, owner, mlp_ours, mlp_ckpt, True)
    shared = config.hybrid.shared_expert_intermediate_size
    if shared:
        names = (mlp_ours + "shared_expert.", mlp_ckpt + "shared_expert.")
        refs += swiglu_refs(h, shared, owner, *names, True)
        gate = "shared_expert_gate.weight"
        refs.append(WeightRef(owner, mlp_ours + gate, mlp_ckpt + gate, (h, 1), True))
    return refs


def hybrid_map(config: ModelConfig) -> list[WeightRef]:
    """Every parameter of a hybrid ``config``'s target model and MTP layers, in model order."""
    assert config.hybrid is not None
    h, v, n_layers = config.hidden_size, config.vocab_size, config.num_hidden_layers
    refs = [WeightRef("target", "embed_tokens.weight", "model.embed_tokens.weight", (v, h))]
    for i, kind in enumerate(config.hybrid.layer_types):
        refs += hybrid_block_refs(config, "target", f"layers.{i}.", f"model.layers.{i}.", kind, i)
    refs.append(WeightRef("target", "norm.weight", "model.norm.weight", (h,)))
    if not config.tie_word_embeddings:
        refs.append(WeightRef("target", "lm_head.weight", "lm_head.weight", (h, v), True))
    fusion, n = FAMILIES["qwen3_next"].fusion, config.num_nextn_predict_layers
    for k in range(n):
        ours = f"layers.{k}." if n > 1 else ""
        for norm in ("enorm", "hnorm", "norm"):
            refs.append(WeightRef("mtp", f"{ours}{norm}.weight", "mtp." + fusion[norm], (h,)))
        eh = WeightRef("mtp", f"{ours}eh_proj.weight", "mtp." + fusion["eh_proj"], (2 * h, h), True)
        refs.append(eh)
        block = (f"{ours}mtp_block.", f"mtp.layers.{k}.")
        refs += hybrid_block_refs(config, "mtp", *block, FULL, n_layers + k)
    return refs
