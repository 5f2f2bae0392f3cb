"""One parameter's place in a checkpoint (:class:`WeightRef`) and the names of a dense decoder
block's parameters (:func:`block_refs`), shared by the model-folder weight maps
(:mod:`~fastdeploy_mtp.models.weight_maps`) and the MTP-layer loader
(:mod:`~fastdeploy_mtp.models.loading`)."""

from __future__ import annotations

from dataclasses import dataclass

from .model_config import ModelConfig


@dataclass(frozen=True)
class WeightRef:
    """One parameter: ``owner`` (``"target"`` or ``"mtp"``), ``ours`` (its name in the owner's
    ``named_parameters()``), ``ckpt`` (the checkpoint tensor), ``shape`` (full shape in our
    layout), ``transpose`` (the checkpoint holds it ``[out, in]``) and ``parts``: when not
    empty, the sizes of the consecutive pieces the tensor is made of along its sharded axis
    (a Gated DeltaNet's queries, keys and values), each split over the tensor-parallel ranks
    on its own (a rank holds its slice of every piece, in order)."""

    owner: str
    ours: str
    ckpt: str
    shape: tuple[int, ...]
    transpose: bool = False
    parts: tuple[int, ...] = ()

    @property
    def ckpt_shape(self) -> tuple[int, ...]:
        """The shape the checkpoint tensor must have."""
        return self.shape[::-1] if self.transpose else self.shape


def block_refs(
    config: ModelConfig, owner: str, ours: str, ckpt: str, transpose: bool, layer: int = 0
) -> list[WeightRef]:
    """The parameters of one :class:`~fastdeploy_mtp.models.layers.DecoderLayer` whose names
    start with ``ours`` (ours) / ``ckpt`` (checkpoint); ``layer`` is its index (MTP layer
    ``k`` = ``num_hidden_layers + k``), which decides a dense or an MoE MLP."""
    h, hd = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    refs = [
        WeightRef(owner, ours + "input_layernorm.weight", ckpt + "input_layernorm.weight", (h,)),
        WeightRef(
            owner,
            ours + "post_attention_layernorm.weight",
            ckpt + "post_attention_layernorm.weight",
            (h,),
        ),
    ]
    if config.attention_type == "mla":
        refs += mla_refs(config, owner, f"{ours}self_attn.", f"{ckpt}self_attn.", transpose)
    else:
        for name, shape in (
            ("q_proj", (h, q)),
            ("k_proj", (h, kv)),
            ("v_proj", (h, kv)),
            ("o_proj", (q, h)),
        ):
            attn_ours, attn_ckpt = f"{ours}self_attn.{name}.", f"{ckpt}self_attn.{name}."
            refs.append(
                WeightRef(owner, attn_ours + "weight", attn_ckpt + "weight", shape, transpose)
            )
            if config.attention_bias and name != "o_proj":
                refs.append(WeightRef(owner, attn_ours + "bias", attn_ckpt + "bias", shape[1:]))
        if config.qk_norm:
            for name in ("q_norm", "k_norm"):
                refs.append(
                    WeightRef(
                        owner,
                        f"{ours}self_attn.{name}.weight",
                        f"{ckpt}self_attn.{name}.weight",
                        (hd,),
                    )
                )
    if config.is_moe_layer(layer):
        return refs + moe_refs(config, owner, ours + "mlp.", ckpt + "mlp.", transpose)
    dense = swiglu_refs(
        config.hidden_size, config.intermediate_size, owner, ours + "mlp.", ckpt + "mlp.", transpose
    )
    return refs + dense


def swiglu_refs(
    h: int, inter: int, owner: str, ours: str, ckpt: str, transpose: bool
) -> list[WeightRef]:
    """``{gate,up,down}_proj.weight`` of a SwiGLU MLP of width ``h`` and inner width ``inter``."""
    shapes = (("gate_proj", (h, inter)), ("up_proj", (h, inter)), ("down_proj", (inter, h)))
    return [
        WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", shape, transpose)
        for n, shape in shapes
    ]


def moe_refs(
    config: ModelConfig, owner: str, ours: str, ckpt: str, transpose: bool
) -> list[WeightRef]:
    """The parameters of a :class:`~fastdeploy_mtp.models.moe.MoEMLP` (names under ``ours`` /
    ``ckpt``, e.g. ``mlp.``): the router ``gate.weight`` (``[H, E]``, ``[E, H]`` in a torch
    checkpoint) and, for ``noaux_tc``, ``gate.e_score_correction_bias [E]`` (ERNIE-4.5,
    ``config.moe_statics``: ``moe_statics.e_score_correction_bias [1, E]``); per expert
    ``experts.{e}.{gate,up,down}_proj.weight``; the shared experts' ``shared_experts.*``."""
    h, e, inter = config.hidden_size, config.n_routed_experts, config.moe_intermediate_size
    refs = [WeightRef(owner, ours + "gate.weight", ckpt + "gate.weight", (h, e), transpose)]
    if config.topk_method == "noaux_tc" and config.moe_statics:  # ERNIE-4.5's name and [1, E]
        bias = "e_score_correction_bias"
        refs.append(WeightRef(owner, f"{ours}gate.{bias}", f"{ckpt}moe_statics.{bias}", (1, e)))
    elif config.topk_method == "noaux_tc":
        bias = "gate.e_score_correction_bias"
        refs.append(WeightRef(owner, ours + bias, ckpt + bias, (e,)))
    for x in range(e):
        refs += swiglu_refs(
            h, inter, owner, f"{ours}experts.{x}.", f"{ckpt}experts.{x}.", transpose
        )
    if config.n_shared_experts:
        shared = inter * config.n_shared_experts
        refs += swiglu_refs(
            h, shared, owner, ours + "shared_experts.", ckpt + "shared_experts.", transpose
        )
    return refs


def mla_refs(
    config: ModelConfig, owner: str, ours: str, ckpt: str, transpose: bool
) -> list[WeightRef]:
    """The parameters of one :class:`~fastdeploy_mtp.models.mla.MLAttention` whose names start
    with ``ours`` / ``ckpt`` (``...self_attn.``): ``q_a_proj``/``q_a_layernorm``/``q_b_proj``
    (or ``q_proj`` when ``q_lora_rank`` is 0), ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
    ``kv_b_proj``, ``o_proj``."""
    h, nh, qr, lr = (
        config.hidden_size,
        config.num_attention_heads,
        config.q_lora_rank,
        config.kv_lora_rank,
    )
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    mats: list[tuple[str, tuple[int, ...]]] = (
        [("q_a_proj", (h, qr)), ("q_b_proj", (qr, nh * qk))] if qr else []
    )
    mats += [] if qr else [("q_proj", (h, nh * qk))]
    mats += [
        ("kv_a_proj_with_mqa", (h, lr + config.qk_rope_head_dim)),
        ("kv_b_proj", (lr, nh * (config.qk_nope_head_dim + config.v_head_dim))),
        ("o_proj", (nh * config.v_head_dim, h)),
    ]
    refs = [
        WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", shape, transpose)
        for n, shape in mats
    ]
    norms = [("q_a_layernorm", qr)] if qr else []
    refs += [
        WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", (d,))
        for n, d in [*norms, ("kv_a_layernorm", lr)]
    ]
    return refs
