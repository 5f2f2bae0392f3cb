"""DeepSeek-V3 ``config.json`` keys -> the multi-head latent attention fields of
:class:`~fastdeploy_mtp.models.model_config.ModelConfig` (``deepseek_v3`` /
``DeepseekV3ForCausalLM``).

Read: ``q_lora_rank`` (null or 0 = a plain ``q_proj``), ``kv_lora_rank``,
``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``rope_interleave`` (default
true, as transformers' class has it). The config's ``num_key_value_heads`` and ``head_dim``
do not shape MLA: every head reads the shared latent, and ``head_dim`` is the RoPE width
``qk_rope_head_dim``. ``attention_bias`` true is refused (the biases on ``q_a_proj``,
``kv_a_proj_with_mqa`` and ``o_proj`` are not implemented).
"""

from __future__ import annotations

from typing import Any

from ..config.validators import flag, integer

#: The MLA shape keys that must be integers > 0.
MLA_SIZES = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _int(raw: dict[str, Any], key: str, minimum: int) -> int:
    value = raw.get(key)
    if value is None:
        raise ValueError(f"config.json has no `{key}` (required for multi-head latent attention)")
    return integer(value, f"config.json `{key}`", minimum)


def mla_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The :class:`ModelConfig` fields of a DeepSeek-V3 ``config.json`` object's attention
    (see the module doc).

    Raises:
        ValueError: one line naming the key that is missing, not an integer, out of range,
            or unsupported.
    """
    sizes = {key: _int(raw, key, 1) for key in MLA_SIZES}
    q_lora = 0 if raw.get("q_lora_rank") is None else _int(raw, "q_lora_rank", 0)
    if sizes["qk_rope_head_dim"] % 2:
        raise ValueError(
            f"config.json `qk_rope_head_dim` must be even for RoPE, got {sizes['qk_rope_head_dim']}"
        )
    interleave = flag(raw.get("rope_interleave", True), "config.json `rope_interleave`")
    if raw.get("attention_bias"):
        raise ValueError(
            "config.json `attention_bias` true is not supported for multi-head latent attention"
        )
    heads = raw.get("num_attention_heads")
    return {
        **sizes,
        "attention_type": "mla",
        "q_lora_rank": q_lora,
        "rope_interleave": interleave,
        "head_dim": sizes["qk_rope_head_dim"],
        "num_key_value_heads": heads,
        "attention_bias": False,
    }
