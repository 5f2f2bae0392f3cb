"""Tiny random ERNIE-4.5 folders (``Ernie4_5ForCausalLM`` dense, ``Ernie4_5_MoeForCausalLM``)
built with transformers' own classes, and the reference outputs transformers computes from
them (torch, float32, CPU, eager attention).

A folder holds what a released HuggingFace "-PT" checkpoint holds: ``config.json`` (with
``num_nextn_predict_layers``), the target saved by ``save_pretrained`` (transformers 5 writes
the fused in-memory experts per expert, ``mlp.experts.{e}.{gate,up,down}_proj.weight``, and the
router's correction bias as ``mlp.moe_statics.e_score_correction_bias [1, E]``), the MTP layer
under its released names -- ``model.mtp_emb_norm.{k}``, ``model.mtp_hidden_norm.{k}``,
``model.mtp_linear_proj.{k}`` and ``model.mtp_block.{k}.<block>``, with no final norm of its
own (``model.norm`` is shared) -- and ``generation_config.json``.

The MTP reference is transformers' ``MtpModel``: for ``ernie4_5_moe`` loaded with
``MtpModel.from_pretrained(target)``, which applies transformers' own renames of the released
names; for the dense class (no MTP support in transformers 5.25) built over the target by hand
and filled by the name map below, as tests/support/hf_folders does for MiMo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import reference_models
from tests.support.hf_folders import _quiet, split_experts
from tests.support.hf_moe_folders import _echo, _tensors
from tests.support.hf_writing import fill_tensors, finish_folder, mtp_layers, save_released_mtp

ARCHITECTURES = {False: "Ernie4_5ForCausalLM", True: "Ernie4_5_MoeForCausalLM"}
#: MtpModel's own names of MTP layer k's fusion tensors -> the released "-PT" names.
_RELEASED = {"enorm": "mtp_emb_norm", "hnorm": "mtp_hidden_norm", "eh_proj": "mtp_linear_proj"}
EOS_TOKEN_IDS = (2,)


@dataclass(frozen=True)
class ErnieFolder:
    """What :func:`make_ernie_folder` wrote: ``config`` is config.json as written."""

    path: Path
    moe: bool
    num_hidden_layers: int
    num_mtp_layers: int
    tie: bool
    echo: bool
    mtp_tensor_names: tuple[str, ...]
    config: dict[str, Any]


def _hf_config(moe: bool, dims: dict[str, Any]):
    import transformers

    _quiet()
    common: dict[str, Any] = dict(
        vocab_size=dims["vocab_size"], hidden_size=64, intermediate_size=96,
        num_hidden_layers=dims["layers"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=dims["tie"],
        use_bias=False, eos_token_id=EOS_TOKEN_IDS[0],
    )  # fmt: skip
    if moe:
        cfg = transformers.Ernie4_5_MoeConfig(
            moe_num_experts=8, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1,
            moe_layer_start_index=dims["moe_start"], moe_layer_end_index=-1, moe_layer_interval=1,
            moe_norm_min=1e-12, **common,
        )  # fmt: skip
    else:
        cfg = transformers.Ernie4_5Config(**common)
    cfg._attn_implementation = "eager"
    return cfg


def _steer_router(named, rng: np.random.Generator) -> None:
    """Correction biases of 0.2 N(0,1): large next to softmax probabilities of 8 experts
    (about 0.125 each), so the bias changes which experts are chosen for many tokens."""
    import torch

    for name, p in named:
        if name.endswith("e_score_correction_bias"):
            with torch.no_grad():
                p.copy_(
                    torch.from_numpy((0.2 * rng.standard_normal(tuple(p.shape))).astype(np.float32))
                )


def _mtp_model(target, num_mtp_layers: int):
    """transformers' MtpModel over ``target``; its ``post_norm`` is the target's ``model.norm``."""
    import torch

    mtp = mtp_layers(target, num_mtp_layers)
    with torch.no_grad():
        for layer in mtp.layers:
            layer.post_norm.weight.copy_(target.model.norm.weight)
    return mtp


def released_names(name: str, tensor) -> dict[str, Any]:
    """MtpModel tensor ``name`` (``layers.{k}.<rest>``) under its released "-PT" name(s); the
    ``post_norm`` (the target's ``model.norm``) has none. A fused expert tensor is split into
    the per-expert ``experts.{e}.{gate,up,down}_proj.weight``; the router's correction bias is
    ``mlp.moe_statics.e_score_correction_bias``."""
    m = re.fullmatch(r"layers\.(\d+)\.([a-z_]+)\.(.+)", name)
    if m is None:
        raise ValueError(f"name: expected 'layers.<k>.<part>.<rest>', got {name!r}")
    k, part, rest = m.groups()
    if part == "post_norm":
        return {}
    if part in _RELEASED:
        return {f"model.{_RELEASED[part]}.{k}.{rest}": tensor}
    if part != "mtp_block":
        raise ValueError(f"name: unknown MTP parameter {name!r}")
    rest = rest.replace("mlp.gate.moe_statics.", "mlp.moe_statics.")
    return split_experts(f"model.mtp_block.{k}.{rest}", tensor)


def make_ernie_folder(
    out_dir: str | Path,
    *,
    moe: bool,
    num_mtp_layers: int = 1,
    tie: bool = True,
    seed: int = 0,
    echo: bool = False,
    vocab_size: int = 300,
    num_hidden_layers: int = 3,
    moe_layer_start_index: int = 1,
) -> ErnieFolder:
    """Write a tiny random ERNIE-4.5 folder: hidden 64, 4 heads of 32 (2 key/value heads, so
    ``o_proj`` is [64, 128]), SwiGLU 96, interleaved RoPE (theta 500000), ``num_hidden_layers``
    layers; with ``moe`` 8 experts (top-2, 32 wide) and 1 shared expert in every layer from
    ``moe_layer_start_index`` on, correction biases large enough to steer the choice (the MTP
    block, built by transformers as layer ``k`` of its MTP config, is dense unless
    ``moe_layer_start_index`` is 0). ``echo``: values reshaped so that K=1 drafts are accepted
    in some rounds and rejected in others (see :func:`_echo`). Returns what it wrote."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dims = dict(
        vocab_size=vocab_size, layers=num_hidden_layers, tie=tie, moe_start=moe_layer_start_index
    )
    cfg = _hf_config(moe, dims)
    torch.manual_seed(seed)
    target = getattr(transformers, ARCHITECTURES[moe])(cfg).eval()
    rng = np.random.default_rng([seed, 45, int(moe)])
    fill_tensors(_tensors(target), rng)
    _steer_router(_tensors(target), rng)
    if echo:
        _echo(_tensors(target), mtp=False)
    target.save_pretrained(str(out), safe_serialization=True)
    names: list[str] = []
    if num_mtp_layers:
        mtp = _mtp_model(target, num_mtp_layers)
        own = [
            (n, t) for n, t in _tensors(mtp) if n.startswith("layers.") and ".post_norm." not in n
        ]
        fill_tensors(own, rng)
        _steer_router(own, rng)
        if echo:
            _echo(own, mtp=True)
        names = save_released_mtp(out, own, released_names)
    gen = {"eos_token_id": list(EOS_TOKEN_IDS), "bos_token_id": 1, "pad_token_id": 0}
    config = finish_folder(
        out, num_mtp_layers, gen, drop=("num_mtp_layers",), architecture=ARCHITECTURES[moe]
    )
    return ErnieFolder(out, moe, num_hidden_layers, num_mtp_layers, tie, echo, tuple(names), config)


# ---- reference outputs ---------------------------------------------------------------------

#: (target, mtp or None) of a folder, cached: the MoE family's MTP layer through transformers'
#: ``MtpModel.from_pretrained`` (its renames: ``mtp_emb_norm.{k}`` -> ``enorm``, ...,
#: ``model.norm`` -> ``post_norm``), the dense one's by its released names.
load_reference = reference_models.models
reference_logits = reference_models.logits
reference_hidden = reference_models.hidden
reference_greedy = reference_models.greedy


def reference_mtp_step(
    folder: str | Path, next_ids, hidden, *, layer: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(logits, output after the shared final norm) of MTP layer ``layer``; see
    :func:`tests.support.reference_models.mtp_step`."""
    return reference_models.mtp_step(folder, layer, next_ids, hidden)


def reference_router(folder: str | Path, layer: int, x) -> tuple[np.ndarray, np.ndarray]:
    """transformers' router of target decoder layer ``layer`` on ``x`` float32 ``[T, H]``:
    (weights ``[T, k]``, chosen experts ``[T, k]``)."""
    import torch

    target, _ = load_reference(folder)
    with torch.no_grad():
        _, weights, chosen = target.model.layers[layer].mlp.gate(
            torch.as_tensor(np.asarray(x, dtype=np.float32))
        )
    return weights.float().numpy(), chosen.numpy()
