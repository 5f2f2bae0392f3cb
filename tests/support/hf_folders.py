"""Tiny random HuggingFace model folders, built with transformers' own model classes, and the
reference outputs transformers computes from them (torch, float32, CPU, eager attention).

A folder holds what a released checkpoint holds: ``config.json``, the target's weights as
``model.safetensors`` or shards plus ``model.safetensors.index.json`` (written by
``save_pretrained``), the MTP layers as one extra shard under their released names, and
``generation_config.json``. Families and their MTP tensor names (``N`` = num_hidden_layers):

* ``llama`` / ``qwen2`` / ``qwen3`` -- DeepSeek style, ``model.layers.{N+k}.{enorm, hnorm,
  eh_proj, shared_head.norm}.weight`` and the decoder block's own names
  (``input_layernorm``, ``self_attn.*``, ``mlp.*``, ``post_attention_layernorm``);
* ``mimo`` -- a Qwen2 target saved as ``MiMoForCausalLM`` with
  ``model.mtp_layers.{k}.{token_layernorm, hidden_layernorm, input_proj, final_layernorm}.weight``
  and the block's names; its projection input is [hidden, embedding] (hidden first).
torch and transformers are imported inside the functions (make_big_folder needs neither).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import reference_models
from tests.support.hf_writing import fill_tensors, fresh_dir, mtp_layers, save_into_single_file

FAMILIES = ("llama", "qwen2", "qwen3", "mimo")
ARCHITECTURES = dict(
    llama="LlamaForCausalLM",
    qwen2="Qwen2ForCausalLM",
    qwen3="Qwen3ForCausalLM",
    mimo="MiMoForCausalLM",
)
#: rope_theta and rms_norm_eps per family: realistic, not the defaults (a loader ignoring them
# fails).
_ROPE_THETA = {"llama": 500000.0, "qwen2": 1000000.0, "qwen3": 1000000.0, "mimo": 640000.0}
_RMS_EPS = {"llama": 1e-5, "qwen2": 1e-6, "qwen3": 1e-6, "mimo": 1e-5}
#: The renames of a MiMo MTP layer's own tensors onto transformers' MtpLayer names.
_MIMO_TO_MTP = dict(
    token_layernorm="enorm",
    hidden_layernorm="hnorm",
    input_proj="eh_proj",
    final_layernorm="post_norm",
)
_DEEPSEEK_TO_MTP = {
    "enorm": "enorm",
    "hnorm": "hnorm",
    "eh_proj": "eh_proj",
    "shared_head.norm": "post_norm",
}
MTP_SHARD = "model-mtp.safetensors"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class FolderInfo:
    """What :func:`make_folder` wrote. ``config`` is config.json as written; the tensor-name
    tuples are sorted; ``eos_token_ids`` is generation_config.json's list."""

    path: Path
    family: str
    num_hidden_layers: int
    num_mtp_layers: int
    sharded: bool
    eos_token_ids: tuple[int, ...]
    target_tensor_names: tuple[str, ...]
    mtp_tensor_names: tuple[str, ...]
    config: dict[str, Any] = field(repr=False)


def rope_example(rope_type: str, max_position_embeddings: int = 256) -> dict[str, Any]:
    """A transformers-5 ``rope_parameters`` dict (without rope_theta) for ``rope_type`` in
    default, linear, dynamic, yarn, llama3, with an original context of half the model's."""
    orig = max_position_embeddings // 2
    examples: dict[str, dict[str, Any]] = {
        "default": {"rope_type": "default"},
        "linear": {"rope_type": "linear", "factor": 2.0},
        "dynamic": {"rope_type": "dynamic", "factor": 2.0},
        "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": orig},
        "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0),
    }
    examples["llama3"]["original_max_position_embeddings"] = orig
    if rope_type not in examples:
        raise ValueError(f"rope_type: expected one of {sorted(examples)}, got {rope_type!r}")
    return dict(examples[rope_type])


def _quiet() -> None:
    """No progress bars or load reports (the folders hold MTP tensors the target class lacks)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def _hf_config(
    family: str,
    *,
    tie: bool,
    rope_scaling: dict[str, Any] | None,
    bias: bool | None,
    dims: dict[str, int],
):
    """The transformers config of the target (the MiMo target is a Qwen2 config)."""
    import transformers

    _quiet()
    rope = {"rope_type": "default", "rope_theta": _ROPE_THETA[family], **(rope_scaling or {})}
    kw: dict[str, Any] = dict(
        vocab_size=dims["vocab_size"], hidden_size=dims["hidden_size"],
        intermediate_size=2 * dims["hidden_size"],
        num_hidden_layers=dims["num_hidden_layers"], num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"], max_position_embeddings=256,
        rms_norm_eps=_RMS_EPS[family],
        tie_word_embeddings=tie, rope_parameters=rope, eos_token_id=dims["eos"],
    )  # fmt: skip
    if family in ("qwen2", "mimo"):
        if bias is False:
            raise ValueError(f"bias: {family} always has q/k/v biases; pass None or True")
        cfg = transformers.Qwen2Config(**kw)
    elif family == "qwen3":
        # an explicit head_dim that differs from hidden_size / heads
        head_dim = 2 * dims["hidden_size"] // dims["heads"]
        cfg = transformers.Qwen3Config(head_dim=head_dim, attention_bias=bool(bias), **kw)
    else:
        cfg = transformers.LlamaConfig(attention_bias=bool(bias), **kw)
    cfg._attn_implementation = "eager"
    return cfg


def released_mtp_name(family: str, num_hidden_layers: int, mtp_name: str) -> str:
    """The checkpoint name of MtpModel parameter ``mtp_name`` (``layers.{k}.<rest>``)."""
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", mtp_name)
    if m is None:
        raise ValueError(f"mtp_name: expected 'layers.<k>.<rest>', got {mtp_name!r}")
    k, rest = int(m.group(1)), m.group(2)
    own = _MIMO_TO_MTP if family == "mimo" else _DEEPSEEK_TO_MTP
    inverse = {v: key for key, v in own.items()}
    head, _, tail = rest.partition(".")
    if rest.startswith("mtp_block."):
        rest = rest[len("mtp_block.") :]
    elif head in inverse:
        rest = f"{inverse[head]}.{tail}"
    else:
        raise ValueError(f"mtp_name: unknown MTP parameter {mtp_name!r}")
    if family == "mimo":
        return f"model.mtp_layers.{k}.{rest}"
    return f"model.layers.{num_hidden_layers + k}.{rest}"


def split_experts(name: str, tensor) -> dict[str, Any]:
    """A tensor under checkpoint name ``name`` as a released folder holds it: transformers 5's
    fused experts (``...mlp.experts.gate_up_proj [E, 2I, H]`` / ``...mlp.experts.down_proj
    [E, H, I]``) split into ``...mlp.experts.{e}.{gate,up,down}_proj.weight``; anything else as
    it is."""
    if name.endswith("mlp.experts.gate_up_proj"):
        base = name[: -len("gate_up_proj")]
        half = tensor.shape[1] // 2
        out = {}
        for e in range(tensor.shape[0]):
            out[f"{base}{e}.gate_proj.weight"] = tensor[e, :half]
            out[f"{base}{e}.up_proj.weight"] = tensor[e, half:]
        return out
    if name.endswith("mlp.experts.down_proj"):
        base = name[: -len("down_proj")]
        return {f"{base}{e}.down_proj.weight": tensor[e] for e in range(tensor.shape[0])}
    return {name: tensor}


def _write_mtp(out: Path, family: str, target, num_mtp_layers: int, rng, dtype: str) -> list[str]:
    """Build, fill and save the MTP layers: as one more shard (MTP_SHARD, added to the index)
    when the target is sharded, else into model.safetensors itself (a folder holds either
    model.safetensors or an index, as transformers picks the single file when both exist)."""
    import torch
    from safetensors.torch import save_file

    mtp = mtp_layers(target, num_mtp_layers, hidden_states_first=family == "mimo")
    own = [(n, p) for n, p in mtp.named_parameters() if n.startswith("layers.")]
    fill_tensors(own, rng)
    n_layers = target.config.num_hidden_layers
    tensors = {
        released_mtp_name(family, n_layers, n): p.detach().to(getattr(torch, dtype)) for n, p in own
    }
    index_path = out / "model.safetensors.index.json"
    if not index_path.exists():
        save_into_single_file(out, tensors)
        return sorted(tensors)
    save_file(tensors, str(out / MTP_SHARD), metadata={"format": "pt"})
    index = json.loads(index_path.read_text())
    index["weight_map"].update(dict.fromkeys(tensors, MTP_SHARD))
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    added = sum(t.numel() * t.element_size() for t in tensors.values())
    index["metadata"]["total_size"] = int(index["metadata"].get("total_size", 0)) + added
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    return sorted(tensors)


def _legacy_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json in the transformers-4 form most released folders still carry: rope_theta and
    rope_scaling (None when default) instead of rope_parameters, torch_dtype instead of dtype."""
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = (
        None if rope.get("rope_type") == "default" else {"type": rope["rope_type"], **rope}
    )
    cfg["torch_dtype"] = cfg.pop("dtype")
    return cfg


def _finish_config(out: Path, family: str, num_mtp_layers: int, legacy: bool) -> dict[str, Any]:
    """Rewrite config.json: drop the keys only MtpModel needed, name the MiMo architecture, set
    num_nextn_predict_layers (absent when 0), optionally in the transformers-4 form."""
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    for key in ("num_mtp_layers", "mtp_layer_types", "mtp_hidden_states_first"):
        cfg.pop(key, None)
    if family == "mimo":
        cfg["model_type"] = "mimo"
    cfg["architectures"] = [ARCHITECTURES[family]]
    if num_mtp_layers:
        cfg["num_nextn_predict_layers"] = num_mtp_layers
    if legacy:
        cfg = _legacy_config(cfg)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return cfg


def make_folder(
    out_dir: str | Path,
    family: str,
    *,
    num_mtp_layers: int = 1,
    tie: bool = False,
    rope_scaling: dict[str, Any] | None = None,
    bias: bool | None = None,
    dtype: str = "float32",
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vocab_size: int = 300,
    seed: int = 0,
    tokenizer_writer: Callable[[Path], object] | None = None,
    sharded: bool | None = None,
    eos_token_ids: tuple[int, int] | None = None,
    legacy_config: bool = False,
) -> FolderInfo:
    """Write a tiny random ``family`` folder into ``out_dir`` (new or empty) and describe it.

    ``rope_scaling``: transformers-5 rope parameters without rope_theta, e.g.
    ``rope_example("yarn")``. ``bias``: None = the family's own (q/k/v biases for qwen2/mimo,
    none for llama/qwen3); True gives llama/qwen3 ``attention_bias``. ``dtype``: what the
    safetensors hold (float32, bfloat16, float16). ``sharded``: None = sharded for qwen3 and
    mimo only. ``eos_token_ids``: generation_config's two eos ids (default 2, 0: <|im_end|>,
    <|endoftext|> of tests/support/tokenizer_files; config.json's ``eos_token_id`` is the
    first). ``legacy_config``: config.json in the transformers-4 form (rope_theta,
    rope_scaling, torch_dtype). ``tokenizer_writer(out_dir)`` is called last.
    """
    if dtype not in DTYPES or family not in FAMILIES or num_mtp_layers < 0:
        raise ValueError(
            f"make_folder: expected dtype in {DTYPES}, family in {FAMILIES}, num_mtp_layers >= 0; "
            f"got {dtype!r}, {family!r}, {num_mtp_layers}"
        )
    out = fresh_dir(out_dir)
    eos = tuple(eos_token_ids) if eos_token_ids is not None else (2, 0)
    dims = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers)
    dims.update(heads=heads, kv_heads=kv_heads, eos=eos[0])
    cfg = _hf_config(family, tie=tie, rope_scaling=rope_scaling, bias=bias, dims=dims)
    sharded = family in ("qwen3", "mimo") if sharded is None else sharded
    target, rng = _write_target(out, family, cfg, seed, dtype, sharded)
    target_names = sorted(_saved_names(out))
    mtp_names = (
        _write_mtp(out, family, target, num_mtp_layers, rng, dtype) if num_mtp_layers else []
    )
    config = _finish_config(out, family, num_mtp_layers, legacy_config)
    gen = {
        "eos_token_id": list(eos),
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if tokenizer_writer is not None:
        tokenizer_writer(out)
    reference_models.forget(out)
    is_sharded = not (out / "model.safetensors").exists()
    return FolderInfo(
        out,
        family,
        num_hidden_layers,
        num_mtp_layers,
        is_sharded,
        eos,
        tuple(target_names),
        tuple(mtp_names),
        config,
    )


def _write_target(out: Path, family: str, cfg, seed: int, dtype: str, sharded: bool):
    """Build the target with transformers' class, fill it, save it in ``dtype`` (sharded small
    enough for several shards, or one file); returns (the float32 target, the rng)."""
    import torch

    torch.manual_seed(seed)
    target = _model_class(family)(cfg).eval()
    rng = np.random.default_rng([seed, FAMILIES.index(family)])
    fill_tensors(target.named_parameters(), rng, tie=cfg.tie_word_embeddings)
    target.config.dtype = dtype
    shard_size = "100KB" if sharded else "10GB"
    target.to(getattr(torch, dtype)).save_pretrained(
        str(out), safe_serialization=True, max_shard_size=shard_size
    )
    return target.float(), rng


def _model_class(family: str):
    """transformers' class of the target (MiMo's target is a Qwen2 model)."""
    import transformers

    return getattr(transformers, ARCHITECTURES["qwen2" if family == "mimo" else family])


def _saved_names(out: Path) -> list[str]:
    """Tensor names of the folder's safetensors files as they stand (headers only)."""
    from safetensors import safe_open

    return [k for f in sorted(out.glob("*.safetensors")) for k in safe_open(str(f), "np").keys()]


# ---- reference outputs ---------------------------------------------------------------------

#: (target, mtp or None): transformers models of a folder in float32, eager attention, cached
#: per path (DeepSeek-style MTP layers through ``MtpModel.from_pretrained``, MiMo's by name).
load_reference = reference_models.models
_ids = reference_models.ids_tensor
reference_logits = reference_models.logits
reference_hidden = reference_models.hidden
reference_mtp_step = reference_models.mtp_step


def reference_greedy(
    folder: str | Path, prompt_ids: list[int], n: int, *, stop_at_eos: bool = False
) -> list[int]:
    """Greedy tokens after ``prompt_ids`` from transformers' ``generate`` (do_sample=False):
    exactly ``n`` of them, or with ``stop_at_eos`` up to and including the first of
    generation_config.json's eos ids."""
    import torch
    from transformers import GenerationConfig

    target, _ = load_reference(folder)
    eos = list(target.generation_config.eos_token_id or []) if stop_at_eos else None
    gen = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)
    # generate fills unset fields (eos among them) from the folder's generation config: hide it
    saved, target.generation_config = target.generation_config, GenerationConfig()
    try:
        with torch.no_grad():
            out = target.generate(_ids([list(prompt_ids)]), generation_config=gen)
    finally:
        target.generation_config = saved
    tokens = out[0, len(prompt_ids) :].tolist()
    if not stop_at_eos and len(tokens) != n:
        raise RuntimeError(f"reference_greedy: generate gave {len(tokens)} tokens, expected {n}")
    return tokens


def reference_mtp_logits(folder: str | Path, layer: int, next_ids, hidden) -> np.ndarray:
    """Logits float32 [B, S, V] of MTP layer ``layer``; see :func:`reference_mtp_step`."""
    return reference_mtp_step(folder, layer, next_ids, hidden)[0]


def make_big_folder(
    out_dir: str | Path, target_mb: int = 200, *, shard_mb: int = 50, seed: int = 0
) -> FolderInfo:
    """A plain random qwen3-shaped float32 folder (no MTP layer) of about ``target_mb`` MiB in
    shards of at most ``shard_mb`` MiB (or one tensor), written with safetensors.numpy (no torch):
    hidden 512,
    8 heads of 64, 4 kv heads, SwiGLU 1536, vocab 8192; the layer count makes up the size."""
    from safetensors.numpy import save_file

    h, inter, vocab, heads, kv, hd = 512, 1536, 8192, 8, 4, 64
    block = {
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (heads * hd, h), "self_attn.k_proj.weight": (kv * hd, h),
        "self_attn.v_proj.weight": (kv * hd, h), "self_attn.o_proj.weight": (h, heads * hd),
        "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,),
        "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
        "mlp.down_proj.weight": (h, inter),
    }  # fmt: skip
    per_layer = 4 * sum(int(np.prod(s)) for s in block.values())
    n_layers = max(1, round((target_mb * 2**20 - 8 * vocab * h) / per_layer))
    plan = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    plan.update({f"model.layers.{i}.{k}": s for i in range(n_layers) for k, s in block.items()})
    shards: list[dict[str, tuple[int, ...]]] = [{}]
    for name, shape in plan.items():
        if (
            sum(4 * int(np.prod(s)) for s in shards[-1].values()) + 4 * int(np.prod(shape))
            > shard_mb * 2**20
        ):
            shards.append({})
        shards[-1][name] = shape
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(
            {n: _big_tensor(rng, s) for n, s in shard.items()},
            str(out / file),
            metadata={"format": "pt"},
        )
        weight_map.update(dict.fromkeys(shard, file))
    index = {
        "metadata": {"total_size": sum(4 * int(np.prod(s)) for s in plan.values())},
        "weight_map": weight_map,
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
        "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": n_layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": False, "attention_bias": False, "dtype": "float32",
        "eos_token_id": vocab - 1,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return FolderInfo(
        out, "qwen3", n_layers, 0, True, (vocab - 1,), tuple(sorted(plan)), (), config
    )


def _big_tensor(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values: norm weights around 1, matrices small uniform noise (fast to draw)."""
    if len(shape) == 1:
        return (1.0 + 0.1 * rng.random(shape, dtype=np.float32)).astype(np.float32)
    return ((rng.random(shape, dtype=np.float32) - 0.5) * (0.1 / np.sqrt(shape[1]))).astype(
        np.float32
    )
