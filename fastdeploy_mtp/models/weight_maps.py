"""Which checkpoint tensor fills which parameter, per family, computed from the config alone.

:func:`weight_map` lists one :class:`WeightRef` per parameter of the target model and its
MTP layers (``owner`` ``"target"`` / ``"mtp"``, our parameter name as ``named_parameters()``
gives it, the checkpoint name, the full unsharded shape in our Paddle ``[in, out]`` layout,
and whether the checkpoint stores it transposed, torch's ``[out, in]``).

- ``fastdeploy_mtp_tiny``: the identity under our names (MTP tensors under ``mtp.``), Paddle layout.
- ``llama``, ``qwen2``, ``qwen3``: ``model.embed_tokens``, ``model.layers.{i}.*``,
  ``model.norm``, ``lm_head`` (absent when tied). MTP layers, if any, DeepSeek-style at
  ``model.layers.{num_hidden_layers + k}.{enorm, hnorm, eh_proj, shared_head.norm, <block>}``.
- ``mimo``: the Qwen2 target plus ``model.mtp_layers.{k}.{token_layernorm, hidden_layernorm,
  input_proj, final_layernorm, <block>}``.
- ``ernie4_5``, ``ernie4_5_moe``: the Llama-style target plus ``model.mtp_emb_norm.{k}``,
  ``model.mtp_hidden_norm.{k}``, ``model.mtp_linear_proj.{k}`` and ``model.mtp_block.{k}.<block>``;
  the MTP layer's final norm is the target's ``model.norm`` (read twice).
- ``qwen3_next``, ``qwen3_5_text``: :mod:`~fastdeploy_mtp.models.hybrid_weights`.

The MTP fusion names come from :data:`~fastdeploy_mtp.models.checkpoint_families.FAMILIES`.
"""

from __future__ import annotations

from .checkpoint_families import FAMILIES
from .ernie_config import ERNIE_FAMILIES, ernie_mtp_names
from .hybrid_weights import hybrid_map
from .model_config import TINY_MODEL_TYPE, ModelConfig
from .weight_refs import WeightRef, block_refs

#: Checkpoint tensors that are never loaded (recomputed buffers).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _target_map(config: ModelConfig, prefix: str, torch_layout: bool) -> list[WeightRef]:
    """The target's tensors: the embedding, the decoder blocks and the final norm under
    ``prefix`` (``""`` in the tiny layout, ``"model."`` in HuggingFace's), and the LM head
    unless it is tied (``torch_layout``: stored ``[out, in]``)."""
    h, v = config.hidden_size, config.vocab_size
    refs = [WeightRef("target", "embed_tokens.weight", f"{prefix}embed_tokens.weight", (v, h))]
    for i in range(config.num_hidden_layers):
        refs += block_refs(
            config, "target", f"layers.{i}.", f"{prefix}layers.{i}.", torch_layout, i
        )
    refs.append(WeightRef("target", "norm.weight", f"{prefix}norm.weight", (h,)))
    if not config.tie_word_embeddings:
        refs.append(WeightRef("target", "lm_head.weight", "lm_head.weight", (h, v), torch_layout))
    return refs


def _tiny_map(config: ModelConfig) -> list[WeightRef]:
    h = config.hidden_size
    refs = _target_map(config, "", torch_layout=False)
    n = config.num_nextn_predict_layers
    for k in range(n):
        ours, layer = (f"layers.{k}." if n > 1 else ""), config.num_hidden_layers + k
        for norm in ("enorm", "hnorm", "norm"):
            refs.append(WeightRef("mtp", f"{ours}{norm}.weight", f"mtp.{ours}{norm}.weight", (h,)))
        refs.append(
            WeightRef("mtp", f"{ours}eh_proj.weight", f"mtp.{ours}eh_proj.weight", (2 * h, h))
        )
        refs += block_refs(
            config, "mtp", f"{ours}mtp_block.", f"mtp.{ours}mtp_block.", False, layer
        )
    return refs


def _mtp_prefix(config: ModelConfig, k: int) -> str:
    if config.model_type == "mimo":
        return f"model.mtp_layers.{k}."
    return f"model.layers.{config.num_hidden_layers + k}."


def _hf_map(config: ModelConfig) -> list[WeightRef]:
    h = config.hidden_size
    refs = _target_map(config, "model.", torch_layout=True)
    fusion = FAMILIES["mimo" if config.model_type == "mimo" else "deepseek_v3"].fusion
    n = config.num_nextn_predict_layers
    if config.model_type in ERNIE_FAMILIES:
        return refs + [r for k in range(n) for r in _ernie_mtp_refs(config, k)]
    for k in range(n):
        ours, ckpt = (f"layers.{k}." if n > 1 else ""), _mtp_prefix(config, k)
        layer = config.num_hidden_layers + k
        for norm in ("enorm", "hnorm", "norm"):
            refs.append(WeightRef("mtp", f"{ours}{norm}.weight", ckpt + fusion[norm], (h,)))
        refs.append(
            WeightRef("mtp", f"{ours}eh_proj.weight", ckpt + fusion["eh_proj"], (2 * h, h), True)
        )
        refs += block_refs(config, "mtp", f"{ours}mtp_block.", ckpt, True, layer)
    return refs


def _ernie_mtp_refs(config: ModelConfig, k: int) -> list[WeightRef]:
    """MTP layer ``k`` of an ERNIE-4.5 "-PT" folder
    (:func:`~fastdeploy_mtp.models.ernie_config.ernie_mtp_names`)."""
    h, names = config.hidden_size, ernie_mtp_names("model.", k)
    ours = f"layers.{k}." if config.num_nextn_predict_layers > 1 else ""
    refs = [
        WeightRef("mtp", f"{ours}{norm}.weight", names[norm], (h,))
        for norm in ("enorm", "hnorm", "norm")
    ]
    refs.append(WeightRef("mtp", f"{ours}eh_proj.weight", names["eh_proj"], (2 * h, h), True))
    layer = config.num_hidden_layers + k
    return refs + block_refs(config, "mtp", f"{ours}mtp_block.", names["block"], True, layer)


def weight_map(config: ModelConfig) -> list[WeightRef]:
    """Every parameter of ``config``'s target model and MTP layers, in model order."""
    if config.hybrid is not None:
        return hybrid_map(config)
    return _tiny_map(config) if config.model_type == TINY_MODEL_TYPE else _hf_map(config)


def ignorable(config: ModelConfig, name: str) -> bool:
    """A checkpoint tensor the model does not read but that is expected in the folder:
    recomputed buffers and the duplicate embedding / LM head DeepSeek-style MTP layers carry
    (``model.layers.{N + k}.embed_tokens`` / ``shared_head.head``; loaded once, from the
    target's)."""
    if name.endswith(IGNORED_SUFFIXES):
        return True
    spec = FAMILIES["deepseek_v3"]
    if config.model_type in (TINY_MODEL_TYPE, "mimo"):
        return False
    for k in range(config.num_nextn_predict_layers):
        index = config.num_hidden_layers + k
        if name in {n.format(index=index) for n in spec.embed + spec.head if "{index}" in n}:
            return True
    return False
