"""Tiny random GLM-4.5 (``Glm4MoeForCausalLM``) folders built with transformers' own classes,
and the reference outputs transformers computes from them (torch, float32, CPU, eager).

A folder holds what a released GLM-4.5 checkpoint holds: ``config.json`` (with
``num_nextn_predict_layers``), the target saved by ``save_pretrained`` (transformers 5 keeps the
experts fused in memory, ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]``,
and writes them per expert, ``mlp.experts.{e}.{gate,up,down}_proj.weight``, as released), the MTP
layer under ``model.layers.{N + k}.{enorm, hnorm, eh_proj, shared_head.norm}`` plus its block's
own names (per-expert too), and ``generation_config.json``.

The MTP reference is transformers' ``MtpModel`` loaded from the folder, as its MTP generation
runs it (no position-0 embedding mask).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import reference_models
from tests.support.hf_folders import _quiet, released_mtp_name, split_experts
from tests.support.hf_writing import fill_tensors, finish_folder, mtp_layers, save_released_mtp

ARCHITECTURE = "Glm4MoeForCausalLM"


@dataclass(frozen=True)
class GlmFolder:
    """What :func:`make_glm_folder` wrote: ``config`` is config.json as written, ``echo`` its
    argument."""

    path: Path
    num_hidden_layers: int
    num_mtp_layers: int
    mtp_tensor_names: tuple[str, ...]
    config: dict[str, Any]
    echo: bool


def _glm_config(dims: dict[str, Any]):
    import transformers

    _quiet()
    cfg = transformers.Glm4MoeConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=dims["layers"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.5}, attention_bias=dims["bias"], use_qk_norm=dims["qk_norm"],
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
        n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=1,
        eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


def _tensors(module) -> list[tuple[str, Any]]:
    """Parameters and persistent buffers (the router's e_score_correction_bias is a buffer)."""
    return list(module.named_parameters()) + [
        (n, b) for n, b in module.named_buffers() if "rotary" not in n
    ]


def _released(num_hidden_layers: int, name: str, tensor) -> dict[str, Any]:
    """MtpModel tensor ``name`` under its released name(s), fused experts split per expert."""
    return split_experts(released_mtp_name("deepseek", num_hidden_layers, name), tensor)


def _echo(named, mtp: bool) -> None:
    """Reshape random values so that drafts are sometimes right: the embedding is halved and an
    untied LM head becomes 0.3 x the embedding (a tied one is it already), so the target often
    repeats its input token; the MTP layer's
    ``eh_proj`` passes the normed token embedding through and its block's output projections
    are scaled by 0.1, so it mostly drafts the token it is fed."""
    import torch

    d = dict(named)
    with torch.no_grad():
        if not mtp:
            d["model.embed_tokens.weight"].mul_(0.5)
            if "lm_head.weight" in d:
                d["lm_head.weight"].copy_(0.3 * d["model.embed_tokens.weight"])
            return
        for name, p in d.items():
            if name.endswith("eh_proj.weight"):
                h = p.shape[0]
                p.zero_()
                p[:, :h] = torch.eye(h)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.mul_(0.1)


def make_glm_folder(
    out_dir: str | Path,
    *,
    num_mtp_layers: int = 1,
    qk_norm: bool = False,
    bias: bool = True,
    num_hidden_layers: int = 2,
    seed: int = 0,
    echo: bool = False,
    tokenizer_writer: Callable[[Path], object] | None = None,
    negative_bias: bool = False,
) -> GlmFolder:
    """Write a tiny random GLM-4.5 folder: hidden 64, 4 heads of 32 (2 key/value heads),
    partial rotary 0.5, ``num_hidden_layers`` layers of which the first is dense
    (``first_k_dense_replace`` 1), 8 experts in 2 groups (top-2, 1 kept group), 1 shared
    expert, routed_scaling_factor 2.5, norm_topk_prob; ``qk_norm`` / ``bias`` switch
    ``use_qk_norm`` / ``attention_bias``. With ``echo`` the values are reshaped so that K=1
    drafts are accepted in some rounds and rejected in others (see :func:`_echo`); plain
    random weights almost never draft right. ``negative_bias``: router biases mostly below 0.
    ``tokenizer_writer(out_dir)`` is called last.
    Returns what it wrote."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _glm_config(dict(layers=num_hidden_layers, bias=bias, qk_norm=qk_norm))
    torch.manual_seed(seed)
    target = transformers.Glm4MoeForCausalLM(cfg).eval()
    rng = np.random.default_rng([seed, 45])
    fill_tensors(_tensors(target), rng, negative_bias=negative_bias)
    if echo:
        _echo(_tensors(target), mtp=False)
    target.save_pretrained(str(out), safe_serialization=True)
    names: list[str] = []
    if num_mtp_layers:
        mtp = mtp_layers(target, num_mtp_layers)
        own = [(n, t) for n, t in _tensors(mtp) if n.startswith("layers.")]
        fill_tensors(own, rng, negative_bias=negative_bias)
        if echo:
            _echo(own, mtp=True)
        names = save_released_mtp(out, own, partial(_released, num_hidden_layers))
    config = finish_folder(
        out,
        num_mtp_layers,
        {"eos_token_id": [2]},
        drop=("num_mtp_layers", "mtp_layer_types"),
        architecture=ARCHITECTURE,
        tokenizer_writer=tokenizer_writer,
    )
    return GlmFolder(out, num_hidden_layers, num_mtp_layers, tuple(names), config, echo)


# ---- reference outputs ---------------------------------------------------------------------

#: (target, mtp or None) of a folder, cached per path (MTP layers through transformers' own
#: ``MtpModel.from_pretrained``: its renames, the per-expert tensors fused back).
load_reference = reference_models.models
reference_logits = reference_models.logits
reference_hidden = reference_models.hidden
reference_greedy = reference_models.recomputed_greedy


def reference_mtp_logits(folder: str | Path, next_ids, hidden, *, layer: int = 0) -> np.ndarray:
    """MTP layer ``layer``'s logits float32 ``[B, S, V]``; see
    :func:`tests.support.reference_models.mtp_step`."""
    return reference_models.mtp_step(folder, layer, next_ids, hidden)[0]
