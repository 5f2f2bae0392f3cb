"""Write a model and its MTP layers as a released-layout model folder, the inverse of
:func:`~fastdeploy_mtp.models.weight_maps.weight_map`.

:func:`save_model_folder` walks the family's weight references: each parameter goes out under
its checkpoint name, transposed back to torch's ``[out, in]`` where the checkpoint stores it so,
in float32 ``model.safetensors``; ``config.json`` is written in the family's own keys (so both
:func:`~fastdeploy_mtp.models.model_folder.load_model` and transformers read the folder), and the
config read back from it must describe the same model (checked before anything is written).

Supported family: ``deepseek_v3`` (``DeepseekV3ForCausalLM``). The MTP layer ``k`` sits at
``model.layers.{num_hidden_layers + k}`` with the duplicate ``embed_tokens`` and
``shared_head.head`` a released DeepSeek-V3 checkpoint carries.

Vocabulary padding: a released ``config.json`` has one ``vocab_size``, the rows of the
embedding; when ``config.ori_vocab_size < config.vocab_size`` (padding whose logits are
``-inf``) only the first ``ori_vocab_size`` rows of the embedding and columns of the LM head are
written, so the folder's logits are the model's real columns exactly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import numpy as np
import paddle

from .checkpoint_families import FAMILIES
from .hf_config import translate_config
from .model_config import ModelConfig
from .weight_maps import weight_map

#: Families :func:`save_model_folder` writes, and their ``architectures`` entry.
WRITABLE = {"deepseek_v3": "DeepseekV3ForCausalLM"}
#: Files of the byte tokenizer copied next to the weights when ``tokenizer_dir`` is given.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: ``ModelConfig`` fields that a folder does not carry (serving settings and the padding).
_NOT_IN_FOLDER = ("vocab_size", "ori_vocab_size", "block_size", "dtype")


def _deepseek_v3_json(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` object of a ``deepseek_v3`` config (transformers 5 key spelling)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling:
        rope = {**config.rope_scaling, "rope_theta": config.rope_theta}
    return {
        "architectures": [WRITABLE["deepseek_v3"]],
        "model_type": "deepseek_v3",
        "vocab_size": config.ori_vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "moe_intermediate_size": config.moe_intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_nextn_predict_layers": config.num_nextn_predict_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_attention_heads,
        "n_shared_experts": config.n_shared_experts,
        "n_routed_experts": config.n_routed_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "routed_scaling_factor": config.routed_scaling_factor,
        "n_group": config.n_group,
        "topk_group": config.topk_group,
        "topk_method": config.topk_method,
        "scoring_func": config.scoring_func,
        "norm_topk_prob": config.norm_topk_prob,
        "first_k_dense_replace": config.first_k_dense_replace,
        "q_lora_rank": config.q_lora_rank or None,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "rope_interleave": config.rope_interleave,
        # how this checkpoint's MTP layer was trained (see hf_config.MTP_CHAIN_DEFAULT)
        "mtp_chain_hidden": "pre_norm" if config.mtp_final_norm == "in_logits" else "post_norm",
        "mtp_mask_first_position": config.mtp_mask_first_position,
        "rope_parameters": rope,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": None,
        "eos_token_id": (config.eos_token_ids or None),
        "dtype": config.dtype,
    }


def folder_config_json(config: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` object for ``config``.

    Raises:
        ValueError: the family is not writable, or the family's keys cannot express the
            config (the field that would read back differently is named).
    """
    if config.model_type not in WRITABLE:
        raise ValueError(
            f"save_model_folder writes {sorted(WRITABLE)} folders, not model_type "
            f"{config.model_type!r}"
        )
    raw = _deepseek_v3_json(config)
    back = translate_config(raw, "(being written)")
    for field in dataclasses.fields(ModelConfig):
        if field.name in _NOT_IN_FOLDER:
            continue
        if getattr(back, field.name) != getattr(config, field.name):
            raise ValueError(
                f"a {config.model_type} config.json cannot express `{field.name}` = "
                f"{getattr(config, field.name)!r} (it reads back as {getattr(back, field.name)!r})"
            )
    return raw


def _tensor(param: paddle.Tensor, transpose: bool, ckpt: str, vocab: int) -> np.ndarray:
    """One parameter as the checkpoint stores it: float32, ``[out, in]`` when ``transpose``,
    the embedding's rows / the LM head's columns beyond ``vocab`` dropped."""
    value = param.astype("float32").numpy()
    if ckpt == "model.embed_tokens.weight":
        value = value[:vocab]
    elif ckpt == "lm_head.weight":
        value = value[:, :vocab]
    return np.ascontiguousarray(value.T if transpose else value)


def checkpoint_tensors(
    target: paddle.nn.Layer, mtp: paddle.nn.Layer | None, config: ModelConfig
) -> dict[str, Any]:
    """``{checkpoint name: float32 array}`` of the target and MTP layers (see the module doc).

    Raises:
        ValueError: a tensor-parallel shard (save the whole model), or an MTP count that
            differs from ``config.num_nextn_predict_layers``.
    """
    if getattr(target, "tensor_parallel_size", 1) != 1:
        raise ValueError("save_model_folder needs the whole model, not a tensor-parallel shard")
    if (mtp is None) != (config.num_nextn_predict_layers == 0):
        raise ValueError(
            f"config has {config.num_nextn_predict_layers} MTP layers, mtp is {type(mtp).__name__}"
        )
    params = {"target": dict(target.named_parameters())}
    if mtp is not None:
        params["mtp"] = dict(mtp.named_parameters())
    vocab = config.ori_vocab_size
    out = {
        r.ckpt: _tensor(params[r.owner][r.ours], r.transpose, r.ckpt, vocab)
        for r in weight_map(config)
    }
    spec = FAMILIES[config.model_type]
    for k in range(config.num_nextn_predict_layers):
        index = config.num_hidden_layers + k
        for dup, source in (spec.embed, spec.head):
            if config.tie_word_embeddings and source == "lm_head.weight":
                source = "model.embed_tokens.weight"
            out[dup.format(index=index)] = out[source]
    return out


def save_model_folder(
    out_dir: str,
    target: paddle.nn.Layer,
    mtp: paddle.nn.Layer | None,
    config: ModelConfig,
    *,
    metrics: dict[str, Any] | None = None,
    tokenizer_dir: str | None = None,
) -> None:
    """Write ``model.safetensors`` (float32, released names and layout), ``config.json``, and
    ``metrics.json`` when ``metrics`` is given, into ``out_dir`` (created if needed).

    Args:
        out_dir: the folder.
        target, mtp: the whole (unsharded) models; ``mtp`` ``None`` for a folder without MTP
            layers.
        config: their config (``model_type`` one of :data:`WRITABLE`).
        metrics: written as ``metrics.json``.
        tokenizer_dir: copy :data:`TOKENIZER_FILES` from here (default: the shipped byte
            tokenizer's folder); ``""`` = write no tokenizer.

    Raises:
        ValueError: as :func:`folder_config_json` and :func:`checkpoint_tensors`.
    """
    from safetensors.numpy import save_file

    from .folder_inspection import ASSETS_DIR

    raw = folder_config_json(config)
    tensors = checkpoint_tensors(target, mtp, config)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=2, sort_keys=True)
        f.write("\n")
    source = ASSETS_DIR if tokenizer_dir is None else tokenizer_dir
    if source and os.path.abspath(source) != os.path.abspath(out_dir):
        for name in TOKENIZER_FILES:
            shutil.copyfile(os.path.join(source, name), os.path.join(out_dir, name))
    if metrics is not None:
        with open(os.path.join(out_dir, "metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2, sort_keys=True)
            f.write("\n")
