"""ERNIE-4.5 ``config.json`` keys -> :class:`~fastdeploy_mtp.models.model_config.ModelConfig`
fields, for the released HuggingFace "-PT" folders: ``ernie4_5`` (``Ernie4_5ForCausalLM``,
dense) and ``ernie4_5_moe`` (``Ernie4_5_MoeForCausalLM``).

Both families rotate interleaved pairs ``(x[2i], x[2i+1])`` over the whole head
(``rope_interleave``), default ``rope_theta`` to 500000, tie the LM head to the embedding
unless ``tie_word_embeddings`` says false, and feed their MTP layer the target's post-norm
state. ``use_bias`` true (biases on q/k/v/o, every MLP and the LM head) is refused.
``num_nextn_predict_layers`` (alias ``num_mtp_layers``) counts the MTP layers; the MoE family
has at most one, as transformers allows.

MoE keys (``ernie4_5_moe``; absent = transformers' ``Ernie4_5_MoeConfig`` default):
``moe_num_experts`` (64), ``moe_k`` (6), ``moe_intermediate_size`` (1536),
``moe_num_shared_experts`` (2), ``moe_layer_start_index`` (1), ``moe_layer_end_index`` (-1 = the
last layer), ``moe_layer_interval`` (1), ``moe_norm_min`` (1e-12). The router is the
``noaux_tc`` rule with softmax scores and one group, weights renormalised with
``moe_norm_min``, no scaling (see :mod:`~fastdeploy_mtp.models.moe`).

:func:`ernie_mtp_names` names the MTP tensors for the folder weight map and the standalone
MTP loader alike.

Every refusal is a ``ValueError`` whose one-line message names the key; the caller adds the
folder.
"""

from __future__ import annotations

from typing import Any

from ..config.validators import flag, given, integer, positive_number

#: ``model_type`` of the dense and the MoE family.
ERNIE_FAMILIES = ("ernie4_5", "ernie4_5_moe")
#: transformers' ``Ernie4_5_MoeConfig`` defaults of the MoE keys.
ERNIE_MOE_DEFAULTS: dict[str, Any] = dict(
    moe_num_experts=64, moe_k=6, moe_intermediate_size=1536, moe_num_shared_experts=2,
    moe_layer_start_index=1, moe_layer_end_index=-1, moe_layer_interval=1, moe_norm_min=1e-12,
)  # fmt: skip
#: ERNIE-4.5's default RoPE base (transformers' ``default_theta`` of both configs).
ERNIE_ROPE_THETA = 500000.0
#: ``head_dim`` when config.json lacks it: transformers' ``Ernie4_5Config`` default (dense);
#: the MoE class falls back to ``hidden_size // num_attention_heads``.
DENSE_HEAD_DIM = 128


def _int(raw: dict[str, Any], key: str, default: int | None, minimum: int) -> int:
    return integer(given(raw, key, default), f"config.json `{key}`", minimum)


def _mtp_layers(raw: dict[str, Any], family: str) -> int:
    keys = [k for k in ("num_nextn_predict_layers", "num_mtp_layers") if raw.get(k) is not None]
    if not keys:
        return 0
    count = _int(raw, keys[0], 0, 0)
    if len(keys) == 2 and raw[keys[1]] != count:
        raise ValueError(
            f"config.json `num_mtp_layers` ({raw[keys[1]]!r}) contradicts "
            f"`num_nextn_predict_layers` ({count})"
        )
    if family == "ernie4_5_moe" and count > 1:
        raise ValueError(
            f"config.json `{keys[0]}` {count} is not supported: ERNIE-4.5 MoE has at most one MTP "
            "layer"
        )
    return count


def _has_theta(raw: dict[str, Any]) -> bool:
    """Whether ``rope_parameters`` / ``rope_scaling`` or the top level gives ``rope_theta``."""
    params: Any = raw.get("rope_parameters")
    if not isinstance(params, dict):
        params = raw.get("rope_scaling")
    params = params if isinstance(params, dict) else {}
    return params.get("rope_theta") is not None or raw.get("rope_theta") is not None


def ernie_fields(raw: dict[str, Any], family: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields an ERNIE-4.5 ``config.json`` object ``raw`` sets on top
    of the common ones (see the module doc).

    Raises:
        ValueError: ``use_bias`` true, a key of the wrong type or out of range, keys that
            contradict each other (``moe_k`` above ``moe_num_experts``, a start index after the
            end index), or more than one MTP layer for the MoE family.
    """
    if flag(given(raw, "use_bias", False), "config.json `use_bias`"):
        raise ValueError(
            "config.json `use_bias` true is not supported (q/k/v/o, MLP and LM head have no biases)"
        )
    tie = flag(given(raw, "tie_word_embeddings", True), "config.json `tie_word_embeddings`")
    fields: dict[str, Any] = {
        "rope_interleave": True,
        "tie_word_embeddings": tie,
        "num_nextn_predict_layers": _mtp_layers(raw, family),
        "mtp_concat_order": "emb_first",
        "mtp_final_norm": "in_forward",
        "mtp_hidden_state": "post_norm",
        "mtp_mask_first_position": False,
    }
    if not _has_theta(raw):
        fields["rope_theta"] = ERNIE_ROPE_THETA
    if family == "ernie4_5" and raw.get("head_dim") is None:
        fields["head_dim"] = DENSE_HEAD_DIM
    if family == "ernie4_5_moe":
        fields.update(_moe_fields(raw))
    return fields


def _moe_fields(raw: dict[str, Any]) -> dict[str, Any]:
    d = ERNIE_MOE_DEFAULTS
    layers = _int(raw, "num_hidden_layers", None, 1)
    experts = _int(raw, "moe_num_experts", d["moe_num_experts"], 2)
    k = _int(raw, "moe_k", d["moe_k"], 1)
    if k > experts:
        raise ValueError(f"config.json `moe_k` ({k}) must be <= `moe_num_experts` ({experts})")
    start = _int(raw, "moe_layer_start_index", d["moe_layer_start_index"], 0)
    end = _int(raw, "moe_layer_end_index", d["moe_layer_end_index"], -1)
    end = layers - 1 if end == -1 else end
    if start > end:
        raise ValueError(
            f"config.json `moe_layer_start_index` ({start}) must be <= `moe_layer_end_index` "
            f"({end})"
        )
    norm_min = positive_number(
        given(raw, "moe_norm_min", d["moe_norm_min"]), "config.json `moe_norm_min`"
    )
    return {
        "n_routed_experts": experts,
        "num_experts_per_tok": k,
        "moe_intermediate_size": _int(raw, "moe_intermediate_size", d["moe_intermediate_size"], 1),
        "n_shared_experts": _int(raw, "moe_num_shared_experts", d["moe_num_shared_experts"], 0),
        "moe_layer_interval": _int(raw, "moe_layer_interval", d["moe_layer_interval"], 1),
        "moe_layer_start_index": start,
        "moe_layer_end_index": end,
        "moe_norm_min": norm_min,
        "moe_statics": True,
        "scoring_func": "softmax",
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "first_k_dense_replace": 0,
    }


def ernie_mtp_names(prefix: str, k: int) -> dict[str, str]:
    """ERNIE-4.5's names of MTP layer ``k`` under the model prefix ``prefix`` (``"ernie."`` in
    the Paddle checkpoints, ``"model."`` in the HuggingFace "-PT" folders): the fusion tensors
    ``enorm``/``hnorm``/``eh_proj`` (``mtp_emb_norm.{k}``, ``mtp_hidden_norm.{k}``,
    ``mtp_linear_proj.{k}``), ``block`` (the decoder block's prefix ``mtp_block.{k}.``) and
    ``norm``: the main model's final norm, which is also the MTP layer's (the layer has none
    of its own)."""
    return {
        "enorm": f"{prefix}mtp_emb_norm.{k}.weight",
        "hnorm": f"{prefix}mtp_hidden_norm.{k}.weight",
        "eh_proj": f"{prefix}mtp_linear_proj.{k}.weight",
        "norm": f"{prefix}norm.weight",
        "block": f"{prefix}mtp_block.{k}.",
    }
