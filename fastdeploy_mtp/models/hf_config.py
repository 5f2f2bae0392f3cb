"""HuggingFace ``config.json`` -> :class:`ModelConfig` for the supported families.

Both key spellings are read: transformers 4 (``rope_theta``, ``rope_scaling`` with ``type`` or
``rope_type``, ``torch_dtype``) and transformers 5 (``rope_parameters`` holding ``rope_theta``
and ``rope_type``, ``dtype``). Anything the dense decoder cannot run is refused with an
:class:`UnsupportedModelError` whose one-line message names the folder and the key.
"""

from __future__ import annotations

from typing import Any

from .model_config import MODEL_DTYPES, ROPE_TYPES, TINY_ARCHITECTURE, TINY_MODEL_TYPE, ModelConfig

#: ``architectures[0]`` -> our family (``ModelConfig.model_type``).
ARCHITECTURES = {
    TINY_ARCHITECTURE: TINY_MODEL_TYPE,
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MiMoForCausalLM": "mimo",
}
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp32": "float32"}


class UnsupportedModelError(ValueError):
    """A model folder this package cannot serve; the message is one line naming the folder
    and what is missing or unsupported."""


def _fail(where: str, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"model folder {where}: {what}")


def family_of(raw: dict[str, Any], where: str) -> str:
    """The family of a ``config.json`` object, from ``architectures[0]``."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise _fail(where, f"config.json has no `architectures` list; supported: {sorted(ARCHITECTURES)}")
    if archs[0] not in ARCHITECTURES:
        supported = sorted(ARCHITECTURES)
        raise _fail(where, f"config.json `architectures` {archs[0]!r} is not supported; supported: {supported}")
    return ARCHITECTURES[archs[0]]


def resolve_dtype(raw: dict[str, Any], requested: str, where: str) -> str:
    """``requested`` (``"auto"`` = the config's ``dtype`` / ``torch_dtype``, float32 when
    absent) as one of :data:`MODEL_DTYPES`."""
    name = requested
    key = "dtype"
    if requested == "auto":
        key = "dtype" if raw.get("dtype") is not None else "torch_dtype"
        name = raw.get(key) or "float32"
        where_key = f"config.json `{key}`"
    else:
        where_key = "`dtype`"
    name = str(name).removeprefix("torch.")
    if name not in _TORCH_DTYPES:
        raise _fail(where, f"{where_key} {name!r} is not supported; expected one of {list(MODEL_DTYPES)}")
    return _TORCH_DTYPES[name]


def _rope(raw: dict[str, Any], where: str) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, normalised rope_scaling or None)``."""
    params = raw.get("rope_parameters")
    key = "rope_parameters"
    if not isinstance(params, dict):
        params = dict(raw.get("rope_scaling") or {})
        key = "rope_scaling"
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise _fail(where, f"config.json `{key}.rope_type` {kind!r} is not supported; supported: {list(ROPE_TYPES)}")
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise _fail(where, "config.json `partial_rotary_factor` != 1 is not supported (RoPE covers the whole head)")
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "type", "rope_type")}
    if kind == "default":
        return float(theta), None
    return float(theta), {"rope_type": kind, **scaling}


def _refuse_unsupported(raw: dict[str, Any], where: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise _fail(where, f"config.json `hidden_act` {act!r} is not supported; only 'silu' (SwiGLU) is")
    if raw.get("mlp_bias"):
        raise _fail(where, "config.json `mlp_bias` true is not supported (MLP projections have no bias)")
    if raw.get("use_sliding_window"):
        raise _fail(where, "config.json `use_sliding_window` true is not supported (full attention only)")
    layer_types = raw.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise _fail(where, "config.json `layer_types` has sliding-window layers; only full attention is supported")
    missing = [k for k in _REQUIRED if raw.get(k) is None]
    if missing:
        raise _fail(where, f"config.json has no `{missing[0]}` (required: {list(_REQUIRED)})")


def eos_ids(raw: dict[str, Any], generation: dict[str, Any] | None) -> list[int]:
    """``eos_token_id`` (int or list) from ``generation_config.json``, else ``config.json``."""
    value = (generation or {}).get("eos_token_id")
    if value is None:
        value = raw.get("eos_token_id")
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def translate_config(
    raw: dict[str, Any], where: str, generation: dict[str, Any] | None = None, dtype: str = "auto"
) -> ModelConfig:
    """A :class:`ModelConfig` from a ``config.json`` object (and ``generation_config.json``).

    Args:
        raw: the parsed ``config.json``.
        where: the folder, for messages.
        generation: the parsed ``generation_config.json`` or ``None``.
        dtype: ``"auto"`` or one of :data:`MODEL_DTYPES`.

    Raises:
        UnsupportedModelError: one line naming the folder and the offending key.
    """
    family = family_of(raw, where)
    resolved = resolve_dtype(raw, dtype, where)
    if family == TINY_MODEL_TYPE:
        data = {k: v for k, v in raw.items() if k != "architectures"}
        data["dtype"] = resolved
        eos = eos_ids({}, generation)
        if eos:
            data["eos_token_ids"] = eos
        try:
            return ModelConfig.from_dict(data)
        except ValueError as exc:
            raise _fail(where, f"config.json: {exc}") from None
    _refuse_unsupported(raw, where)
    theta, scaling = _rope(raw, where)
    heads = int(raw["num_attention_heads"])
    fields: dict[str, Any] = {
        "model_type": family,
        "vocab_size": int(raw["vocab_size"]),
        "ori_vocab_size": int(raw["vocab_size"]),
        "hidden_size": int(raw["hidden_size"]),
        "num_hidden_layers": int(raw["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(raw.get("num_key_value_heads") or heads),
        "head_dim": int(raw.get("head_dim") or 0),
        "intermediate_size": int(raw["intermediate_size"]),
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": int(raw.get("max_position_embeddings", 4096)),
        "attention_bias": family in ("qwen2", "mimo") or bool(raw.get("attention_bias", False)),
        "qk_norm": family == "qwen3",
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "num_nextn_predict_layers": int(raw.get("num_nextn_predict_layers") or 0),
        "mtp_concat_order": "hidden_first" if family == "mimo" else "emb_first",
        "mtp_final_norm": "in_forward",
        "mtp_hidden_state": "post_norm",
        "dtype": resolved,
        "eos_token_ids": eos_ids(raw, generation),
    }
    try:
        return ModelConfig(**fields)
    except ValueError as exc:
        raise _fail(where, f"config.json: {exc}") from None
