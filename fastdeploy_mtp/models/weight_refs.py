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
    layout) and ``transpose`` (the checkpoint holds it ``[out, in]``)."""

    owner: str
    ours: str
    ckpt: str
    shape: tuple[int, ...]
    transpose: bool = False

    @property
    def ckpt_shape(self) -> tuple[int, ...]:
        """The shape the checkpoint tensor must have."""
        return self.shape[::-1] if self.transpose else self.shape


def block_refs(config: ModelConfig, owner: str, ours: str, ckpt: str, transpose: bool) -> list[WeightRef]:
    """The parameters of one :class:`~fastdeploy_mtp.models.layers.DecoderLayer` whose names
    start with ``ours`` (ours) / ``ckpt`` (checkpoint)."""
    h, hd, i = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    refs = [
        WeightRef(owner, ours + "input_layernorm.weight", ckpt + "input_layernorm.weight", (h,)),
        WeightRef(owner, ours + "post_attention_layernorm.weight", ckpt + "post_attention_layernorm.weight", (h,)),
    ]
    if config.attention_type == "mla":
        refs += mla_refs(config, owner, f"{ours}self_attn.", f"{ckpt}self_attn.", transpose)
    else:
        for name, shape in (("q_proj", (h, q)), ("k_proj", (h, kv)), ("v_proj", (h, kv)), ("o_proj", (q, h))):
            attn_ours, attn_ckpt = f"{ours}self_attn.{name}.", f"{ckpt}self_attn.{name}."
            refs.append(WeightRef(owner, attn_ours + "weight", attn_ckpt + "weight", shape, transpose))
            if config.attention_bias and name != "o_proj":
                refs.append(WeightRef(owner, attn_ours + "bias", attn_ckpt + "bias", shape[1:]))
        if config.qk_norm:
            for name in ("q_norm", "k_norm"):
                refs.append(WeightRef(owner, f"{ours}self_attn.{name}.weight", f"{ckpt}self_attn.{name}.weight", (hd,)))
    for name, shape in (("gate_proj", (h, i)), ("up_proj", (h, i)), ("down_proj", (i, h))):
        refs.append(WeightRef(owner, f"{ours}mlp.{name}.weight", f"{ckpt}mlp.{name}.weight", shape, transpose))
    return refs


def mla_refs(config: ModelConfig, owner: str, ours: str, ckpt: str, transpose: bool) -> list[WeightRef]:
    """The parameters of one :class:`~fastdeploy_mtp.models.mla.MLAttention` whose names start
    with ``ours`` / ``ckpt`` (``...self_attn.``): ``q_a_proj``/``q_a_layernorm``/``q_b_proj``
    (or ``q_proj`` when ``q_lora_rank`` is 0), ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
    ``kv_b_proj``, ``o_proj``."""
    h, nh, qr, lr = config.hidden_size, config.num_attention_heads, config.q_lora_rank, config.kv_lora_rank
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    mats: list[tuple[str, tuple[int, ...]]] = [("q_a_proj", (h, qr)), ("q_b_proj", (qr, nh * qk))] if qr else []
    mats += [] if qr else [("q_proj", (h, nh * qk))]
    mats += [
        ("kv_a_proj_with_mqa", (h, lr + config.qk_rope_head_dim)),
        ("kv_b_proj", (lr, nh * (config.qk_nope_head_dim + config.v_head_dim))),
        ("o_proj", (nh * config.v_head_dim, h)),
    ]
    refs = [WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", shape, transpose) for n, shape in mats]
    norms = [("q_a_layernorm", qr)] if qr else []
    refs += [
        WeightRef(owner, f"{ours}{n}.weight", f"{ckpt}{n}.weight", (d,)) for n, d in [*norms, ("kv_a_layernorm", lr)]
    ]
    return refs
