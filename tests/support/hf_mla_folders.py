"""Tiny random DeepSeek-V3 (``DeepseekV3ForCausalLM``) folders built with transformers' own
class, and the reference outputs transformers computes from them (torch, float32, CPU, eager).

A folder holds what a released DeepSeek-V3 checkpoint holds: ``config.json``, the target's
weights as ``save_pretrained`` writes them (per-expert ``mlp.experts.{e}.{gate,up,down}_proj``
tensors, the router's ``mlp.gate.weight`` and ``e_score_correction_bias``), and the MTP layers
at ``model.layers.{N + k}.{enorm, hnorm, eh_proj, shared_head.norm, <block>}`` (``N`` =
num_hidden_layers; the block is MLA + MoE, as transformers' ``MtpModel`` builds it), plus
``generation_config.json``. Every tensor is drawn from a seeded generator. Like DeepSeek's
release, each MTP layer also carries copies of the embedding and the LM head
(``model.layers.{N + k}.embed_tokens.weight``, ``shared_head.head.weight``).

The MTP reference applies DeepSeek's position-0 mask: the token embedding at position 0 is
zeroed before the layer (``inputs_embeds``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import reference_models
from tests.support.hf_folders import FolderInfo, released_mtp_name, split_experts
from tests.support.hf_writing import fill_tensors, finish_folder, fresh_dir, mtp_layers

FAMILY = "deepseek_v3"
ARCHITECTURE = "DeepseekV3ForCausalLM"
#: yarn as DeepSeek-V3 ships it (mscale and mscale_all_dim both 1), on a 64-token original context.
YARN = {
    "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
    "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
}  # fmt: skip


def _config(
    *,
    q_lora_rank: int,
    yarn: bool,
    num_mtp_layers: int,
    first_k_dense_replace: int,
    experts: int,
    vocab_size: int,
):
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if yarn:
        rope = {**YARN, "rope_theta": 10000.0}
    cfg = transformers.DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=experts,
        routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=q_lora_rank or None,
        qk_rope_head_dim=8,
        v_head_dim=16, qk_nope_head_dim=16, n_group=2, topk_group=1, num_experts_per_tok=2,
        first_k_dense_replace=first_k_dense_replace, norm_topk_prob=True,
        max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters=rope, rope_interleave=True,
        num_mtp_layers=num_mtp_layers,
        eos_token_id=2, bos_token_id=0,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


def _tensors_of(model) -> list[tuple[str, Any]]:
    return [*model.named_parameters(), *model.named_buffers()]


def make_mla_folder(
    out_dir: str | Path,
    *,
    q_lora_rank: int = 32,
    yarn: bool = False,
    num_mtp_layers: int = 1,
    first_k_dense_replace: int = 1,
    experts: int = 4,
    vocab_size: int = 300,
    seed: int = 0,
    tokenizer_writer: Callable[[Path], object] | None = None,
    negative_bias: bool = False,
) -> FolderInfo:
    """Write a tiny random DeepSeek-V3 folder into ``out_dir`` (new or empty): hidden 64, 2
    layers (the first ``first_k_dense_replace`` dense, the rest MoE with ``experts`` routed
    experts, 2 per token in 2 groups, one shared expert), 4 heads, ``q_lora_rank`` (0 = plain
    ``q_proj``), kv_lora_rank 32, nope 16, rope 8, v 16, interleaved RoPE, yarn RoPE when
    ``yarn``, ``vocab_size`` tokens, ``num_mtp_layers`` MTP layers, router biases mostly below
    zero with ``negative_bias``; ``tokenizer_writer(out_dir)`` is called last."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    out = fresh_dir(out_dir)
    cfg = _config(
        q_lora_rank=q_lora_rank, yarn=yarn, num_mtp_layers=num_mtp_layers,
        first_k_dense_replace=first_k_dense_replace, experts=experts, vocab_size=vocab_size,
    )  # fmt: skip
    torch.manual_seed(seed)
    rng = np.random.default_rng([seed, 3])
    target = transformers.DeepseekV3ForCausalLM(cfg).eval()
    fill_tensors(_tensors_of(target), rng, negative_bias=negative_bias, correction_bias_scale=0.05)
    target.save_pretrained(str(out), safe_serialization=True)
    target_names = sorted(load_file(str(out / "model.safetensors")))
    mtp_names: list[str] = []
    if num_mtp_layers:
        mtp = mtp_layers(target, num_mtp_layers)
        own = [(n, p) for n, p in _tensors_of(mtp) if n.startswith("layers.")]
        fill_tensors(own, rng, negative_bias=negative_bias, correction_bias_scale=0.05)
        tensors: dict[str, Any] = {}
        for n, p in own:
            for name, t in split_experts(released_mtp_name(FAMILY, 2, n), p.detach()).items():
                tensors[name] = t.contiguous().clone()
        single = str(out / "model.safetensors")
        saved = load_file(single)
        for k in range(num_mtp_layers):  # DeepSeek's MTP layers repeat the embedding and the head
            tensors[f"model.layers.{2 + k}.embed_tokens.weight"] = saved[
                "model.embed_tokens.weight"
            ].clone()
            tensors[f"model.layers.{2 + k}.shared_head.head.weight"] = saved[
                "lm_head.weight"
            ].clone()
        save_file({**saved, **tensors}, single, metadata={"format": "pt"})
        mtp_names = sorted(tensors)
    config = finish_folder(
        out,
        num_mtp_layers,
        {"eos_token_id": [2]},
        drop=("mtp_layer_types",),
        tokenizer_writer=tokenizer_writer,
    )
    return FolderInfo(
        out, FAMILY, 2, num_mtp_layers, False, (2,), tuple(target_names), tuple(mtp_names), config
    )


# ---- reference outputs ---------------------------------------------------------------------

#: (target, mtp or None): transformers' DeepseekV3ForCausalLM and MtpModel of a folder, cached.
load_mla_reference = reference_models.models
mla_reference_logits = reference_models.logits
mla_reference_hidden = reference_models.hidden
mla_reference_greedy = reference_models.recomputed_greedy


def mla_reference_mtp_logits(folder: str | Path, layer: int, next_ids, hidden) -> np.ndarray:
    """MTP layer ``layer``'s logits float32 ``[B, S, V]``; see
    :func:`tests.support.reference_models.mtp_step`."""
    return reference_models.mtp_step(folder, layer, next_ids, hidden)[0]
