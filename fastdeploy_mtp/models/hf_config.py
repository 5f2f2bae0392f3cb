"""HuggingFace ``config.json`` -> :class:`ModelConfig` for the supported families.

Both key spellings are read: transformers 4 (``rope_theta``, ``rope_scaling`` with ``type`` or
``rope_type``, ``torch_dtype``) and transformers 5 (``rope_parameters`` holding ``rope_theta``
and ``rope_type``, ``dtype``). Anything the dense decoder cannot run is refused with an
:class:`UnsupportedModelError` whose one-line message names the folder and the key.
"""

from __future__ import annotations

import functools
from typing import Any

from ..config.validators import ErrorFactory, flag, given, integer, number, positive_number
from .ernie_config import ERNIE_FAMILIES, ernie_fields
from .hybrid_config import HYBRID_FAMILIES, hybrid_fields
from .mla_config import mla_fields
from .model_config import MODEL_DTYPES, ROPE_TYPES, TINY_ARCHITECTURE, TINY_MODEL_TYPE, ModelConfig
from .moe_config import MOE_DEFAULTS, glm_fields, moe_fields

#: ``architectures[0]`` -> our family (``ModelConfig.model_type``).
ARCHITECTURES = {
    TINY_ARCHITECTURE: TINY_MODEL_TYPE,
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MiMoForCausalLM": "mimo",
    "Glm4MoeForCausalLM": "glm4_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Ernie4_5ForCausalLM": "ernie4_5",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForCausalLM": "qwen3_5_text",
}
_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
_TORCH_DTYPES = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "fp32": "float32",
}


class UnsupportedModelError(ValueError):
    """A model folder this package cannot serve; the message is one line naming the folder
    and what is missing or unsupported."""


def _fail(where: str, what: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"model folder {where}: {what}")


def _failure(where: str) -> ErrorFactory:
    """The error factory the shared validators raise through: :func:`_fail` for ``where``."""
    return functools.partial(_fail, where)


def family_of(raw: dict[str, Any], where: str) -> str:
    """The family of a ``config.json`` object, from ``architectures[0]``."""
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise _fail(
            where, f"config.json has no `architectures` list; supported: {sorted(ARCHITECTURES)}"
        )
    if archs[0] not in ARCHITECTURES:
        supported = sorted(ARCHITECTURES)
        raise _fail(
            where,
            f"config.json `architectures` {archs[0]!r} is not supported; supported: {supported}",
        )
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
        raise _fail(
            where, f"{where_key} {name!r} is not supported; expected one of {list(MODEL_DTYPES)}"
        )
    return _TORCH_DTYPES[name]


#: Per RoPE type: the parameters it needs (each a number > 0).
_ROPE_REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
#: Optional RoPE parameters that, when given, must be numbers > 0 (``mscale`` may be 0).
_ROPE_POSITIVE = (
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "mscale_all_dim",
)


def _rope(
    raw: dict[str, Any], where: str, partial_ok: bool = False
) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, normalised rope_scaling or None)``; every parameter the type uses is
    checked here (a number, in range), so a bad one is refused before anything loads.
    ``partial_rotary_factor`` is refused unless ``partial_ok`` (the family reads it itself)."""
    params = raw.get("rope_parameters")
    key = "rope_parameters"
    if not isinstance(params, dict):
        scaling_raw = raw.get("rope_scaling")
        if scaling_raw is not None and not isinstance(scaling_raw, dict):
            raise _fail(where, f"config.json `rope_scaling` must be an object, got {scaling_raw!r}")
        params = dict(scaling_raw or {})
        key = "rope_scaling"
    theta = _positive(params, "rope_theta", f"{key}.rope_theta", where, None)
    if theta is None:
        theta = _positive(raw, "rope_theta", "rope_theta", where, 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise _fail(
            where,
            f"config.json `{key}.rope_type` {kind!r} is not supported; supported: "
            f"{list(ROPE_TYPES)}",
        )
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0 and not partial_ok:
        raise _fail(
            where,
            "config.json `partial_rotary_factor` != 1 is not supported (RoPE covers the whole "
            "head)",
        )
    for name in _ROPE_REQUIRED.get(kind, ()):
        if params.get(name) is None:
            raise _fail(where, f"config.json `{key}.{name}` is required for rope_type {kind!r}")
    for name in (*_ROPE_REQUIRED.get(kind, ()), *_ROPE_POSITIVE):
        _positive(params, name, f"{key}.{name}", where, None)
    if params.get("mscale") is not None:
        _positive(params, "mscale", f"{key}.mscale", where, None, allow_zero=True)
    if params.get("truncate") is not None:
        flag(params["truncate"], f"config.json `{key}.truncate`", _failure(where))
    if kind == "llama3" and float(params["high_freq_factor"]) <= float(params["low_freq_factor"]):
        raise _fail(where, f"config.json `{key}.high_freq_factor` must be above `low_freq_factor`")
    dropped = ("rope_theta", "type", "rope_type", "partial_rotary_factor")
    scaling = {k: v for k, v in params.items() if k not in dropped}
    if kind == "default":
        return float(theta), None
    return float(theta), {"rope_type": kind, **scaling}


def _positive(
    params: dict[str, Any],
    name: str,
    label: str,
    where: str,
    default: Any,
    allow_zero: bool = False,
) -> Any:
    """``params[name]`` as a float > 0 (>= 0 with ``allow_zero``), ``default`` when absent;
    refused naming ``label`` otherwise."""
    value = params.get(name)
    if value is None:
        return default
    return positive_number(value, f"config.json `{label}`", allow_zero, _failure(where))


def _refuse_unsupported(raw: dict[str, Any], where: str, family: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise _fail(
            where, f"config.json `hidden_act` {act!r} is not supported; only 'silu' (SwiGLU) is"
        )
    if raw.get("mlp_bias"):
        raise _fail(
            where, "config.json `mlp_bias` true is not supported (MLP projections have no bias)"
        )
    if raw.get("use_sliding_window"):
        raise _fail(
            where, "config.json `use_sliding_window` true is not supported (full attention only)"
        )
    layer_types = raw.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise _fail(where, f"config.json `layer_types` must be a list, got {layer_types!r}")
    if family not in HYBRID_FAMILIES and any(t != "full_attention" for t in layer_types):
        raise _fail(
            where,
            "config.json `layer_types` has sliding-window layers; only full attention is supported",
        )
    missing = [k for k in _REQUIRED if raw.get(k) is None]
    if missing:
        raise _fail(where, f"config.json has no `{missing[0]}` (required: {list(_REQUIRED)})")


def _number(raw: dict[str, Any], key: str, kind: type, where: str, default: Any = None) -> Any:
    """``raw[key]`` as ``kind`` (``int``: an integer; ``float``: any number), ``default`` when
    absent or null; anything else (a string, a bool, a fraction for an integer) is refused
    naming the key."""
    value = raw.get(key)
    if value is None:
        return default
    check = integer if kind is int else number
    return check(value, f"config.json `{key}`", error=_failure(where))


def _flag(raw: dict[str, Any], key: str, where: str) -> bool:
    """``raw[key]`` as a bool (false when absent or null); anything but true/false is refused."""
    return flag(given(raw, key, False), f"config.json `{key}`", _failure(where))


#: What MTP substep ``k + 1`` is fed as its previous hidden state when ``config.json`` does not
#: say (``mtp_chain_hidden``): the MTP block's output before the layer's final norm
#: (``"pre_norm"``: DeepSeek-V3 and GLM-4.5, whose MTP layer hands the next one its block output
#: and norms only for the logits, as vLLM and SGLang run them) or after it (``"post_norm"``:
#: every other family; ERNIE-4.5's serving runner copies the normed output forward).
MTP_CHAIN_DEFAULT = {"deepseek_v3": "pre_norm", "glm4_moe": "pre_norm"}
#: ``mtp_chain_hidden`` -> :attr:`ModelConfig.mtp_final_norm` (where the norm sits decides
#: which state ``forward`` returns and so what the next substep is fed).
_CHAIN_TO_FINAL_NORM = {"pre_norm": "in_logits", "post_norm": "in_forward"}


def mtp_final_norm_of(raw: dict[str, Any], family: str, where: str) -> str:
    """``ModelConfig.mtp_final_norm`` of a folder: ``config.json`` ``mtp_chain_hidden``
    (``"pre_norm"`` / ``"post_norm"``, for a checkpoint whose MTP layer was trained chained the
    other way) or the family's default (:data:`MTP_CHAIN_DEFAULT`)."""
    chain = raw.get("mtp_chain_hidden", MTP_CHAIN_DEFAULT.get(family, "post_norm"))
    if chain not in _CHAIN_TO_FINAL_NORM:
        raise _fail(
            where,
            f"config.json `mtp_chain_hidden` must be one of {list(_CHAIN_TO_FINAL_NORM)}, got "
            f"{chain!r}",
        )
    return _CHAIN_TO_FINAL_NORM[chain]


def eos_ids(raw: dict[str, Any], generation: dict[str, Any] | None, where: str = "") -> list[int]:
    """Every ``eos_token_id`` (an int or a list) of ``generation_config.json`` and of
    ``config.json``, in that order, without repeats; ``[]`` when neither names one (the model
    then runs every request to ``max_tokens``). Anything but token ids is refused naming the
    file."""
    out: list[int] = []
    for source, obj in (("generation_config.json", generation or {}), ("config.json", raw)):
        value = obj.get("eos_token_id")
        if value is None:
            continue
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
            raise _fail(
                where,
                f"{source} `eos_token_id` must be a token id or a list of them, got {value!r}",
            )
        out.extend(int(v) for v in items if int(v) not in out)
    return out


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
        eos = eos_ids({}, generation, where)
        if eos:
            data["eos_token_ids"] = eos
        try:
            return ModelConfig.from_dict(data)
        except ValueError as exc:
            raise _fail(where, f"config.json: {exc}") from None
    _refuse_unsupported(raw, where, family)
    theta, scaling = _rope(raw, where, partial_ok=family in ("glm4_moe", *HYBRID_FAMILIES))
    heads = _number(raw, "num_attention_heads", int, where)
    fields: dict[str, Any] = {
        "model_type": family,
        "vocab_size": _number(raw, "vocab_size", int, where),
        "ori_vocab_size": _number(raw, "vocab_size", int, where),
        "hidden_size": _number(raw, "hidden_size", int, where),
        "num_hidden_layers": _number(raw, "num_hidden_layers", int, where),
        "num_attention_heads": heads,
        "num_key_value_heads": _number(raw, "num_key_value_heads", int, where, heads),
        "head_dim": _number(raw, "head_dim", int, where, 0),
        "intermediate_size": _number(raw, "intermediate_size", int, where),
        "rms_norm_eps": _number(raw, "rms_norm_eps", float, where, 1e-6),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": _number(raw, "max_position_embeddings", int, where, 4096),
        "attention_bias": family in ("qwen2", "mimo") or _flag(raw, "attention_bias", where),
        "qk_norm": family == "qwen3",
        "tie_word_embeddings": _flag(raw, "tie_word_embeddings", where),
        "num_nextn_predict_layers": _number(raw, "num_nextn_predict_layers", int, where, 0),
        "mtp_concat_order": "hidden_first" if family == "mimo" else "emb_first",
        "mtp_final_norm": mtp_final_norm_of(raw, family, where),
        "mtp_mask_first_position": _flag(raw, "mtp_mask_first_position", where),
        "mtp_hidden_state": "post_norm",
        "dtype": resolved,
        "eos_token_ids": eos_ids(raw, generation, where),
    }
    try:  # the MoE, GLM-4.5 and MLA keys: their messages name config.json and the key
        fields.update(moe_fields(raw, family) if family in MOE_DEFAULTS else {})
        fields.update(glm_fields(raw) if family == "glm4_moe" else {})
        fields.update(mla_fields(raw) if family == "deepseek_v3" else {})
        fields.update(ernie_fields(raw, family) if family in ERNIE_FAMILIES else {})
        fields.update(hybrid_fields(raw, family) if family in HYBRID_FAMILIES else {})
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    try:
        return ModelConfig(**fields)
    except ValueError as exc:
        raise _fail(where, f"config.json: {exc}") from None
