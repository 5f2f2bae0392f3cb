"""What the writers of tiny random HuggingFace folders (``hf_folders``, ``hf_moe_folders``,
``hf_mla_folders``, ``hf_ernie_folders``) share: the output folder, the seeded weights, the
MTP layers (transformers' ``MtpModel``, as the draft-fidelity reference builds it), the MTP
tensors added to the single weight file, and ``config.json`` / ``generation_config.json`` as
released folders have them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fastdeploy_mtp.checks.transformers_models import new_mtp_model
from tests.support import reference_models


def fresh_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a new (or empty) directory; refuses one that holds files."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"out_dir: expected a new or empty directory, {out} has files")
    out.mkdir(parents=True, exist_ok=True)
    return out


def fill_tensors(
    named: Iterable[tuple[str, Any]],
    rng: np.random.Generator,
    *,
    tie: bool = False,
    negative_bias: bool = False,
    correction_bias_scale: float = 0.1,
) -> None:
    """Seeded values for every tensor, in name order (fresh fused-expert buffers may hold
    NaN): norm weights 1 + 0.1 N(0,1), biases 0.1 N(0,1), the router's
    ``e_score_correction_bias`` ``correction_bias_scale`` N(0,1) (-0.8 + 0.4 N(0,1) with
    ``negative_bias``: many biased scores below 0, where masking dropped groups with 0
    instead of -inf would pick their experts), matrices (2-D, and 3-D per expert)
    N(0,1) / sqrt(fan_in) (the last axis; an untied LM head twice that, so logits have clear
    winners), embeddings 0.5 N(0,1)."""
    import torch

    for name, p in sorted(named, key=lambda item: item[0]):
        shape = tuple(p.shape)
        if name.endswith("e_score_correction_bias"):
            value = (
                -0.8 + 0.4 * rng.standard_normal(shape)
                if negative_bias
                else correction_bias_scale * rng.standard_normal(shape)
            )
        elif name.endswith("bias"):
            value = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            value = 0.5 * rng.standard_normal(shape)
        else:
            scale = 2.0 if ("lm_head" in name and not tie) else 1.0
            value = scale * rng.standard_normal(shape) / np.sqrt(shape[-1])
        with torch.no_grad():
            p.copy_(torch.from_numpy(value.astype(np.float32)))


def mtp_layers(target, num_mtp_layers: int, hidden_states_first: bool = False):
    """transformers' ``MtpModel`` over ``target`` (eval mode), as the reference builds it."""
    return new_mtp_model(target, num_mtp_layers, hidden_states_first).eval()


def save_into_single_file(out: Path, tensors: dict[str, Any]) -> None:
    """Add ``tensors`` to the folder's ``model.safetensors``."""
    from safetensors.torch import load_file, save_file

    single = str(out / "model.safetensors")
    save_file({**load_file(single), **tensors}, single, metadata={"format": "pt"})


def save_released_mtp(
    out: Path, own: Iterable[tuple[str, Any]], released: Callable[[str, Any], dict[str, Any]]
) -> list[str]:
    """Add the MTP layers' tensors `own` ((MtpModel name, tensor) pairs) to the folder's
    ``model.safetensors`` under their released names (``released(name, tensor)`` -> {released
    name: tensor}), each made contiguous; returns those names, sorted."""
    tensors: dict[str, Any] = {}
    for n, t in own:
        tensors.update(released(n, t.detach()))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_into_single_file(out, tensors)
    return sorted(tensors)


def finish_folder(
    out: Path,
    num_mtp_layers: int,
    generation: dict[str, Any],
    *,
    drop: tuple[str, ...] = (),
    architecture: str | None = None,
    tokenizer_writer: Callable[[Path], object] | None = None,
) -> dict[str, Any]:
    """Rewrite ``config.json`` as a released folder has it (without the ``drop`` keys only
    ``MtpModel`` reads; ``architecture`` when given; ``num_nextn_predict_layers``), write
    ``generation_config.json``, call ``tokenizer_writer(out)`` and forget the folder's cached
    reference models; returns the config."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    for key in drop:
        config.pop(key, None)
    if architecture is not None:
        config["architectures"] = [architecture]
    config["num_nextn_predict_layers"] = num_mtp_layers
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation) + "\n")
    if tokenizer_writer is not None:
        tokenizer_writer(out)
    reference_models.forget(out)
    return config
