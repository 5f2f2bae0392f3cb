"""``config.json`` MoE keys -> :class:`~fastdeploy_mtp.models.model_config.ModelConfig` fields.

DeepSeek-V3 (``deepseek_v3``) and GLM-4.5 (``glm4_moe``) name their router and experts alike:
``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``,
``n_group``, ``topk_group``, ``routed_scaling_factor``, ``norm_topk_prob``,
``first_k_dense_replace``, ``scoring_func``, ``topk_method``. A key that is absent takes the
default transformers gives the family (:data:`MOE_DEFAULTS`). Every refusal is a
``ValueError`` whose one-line message names the key; the caller adds the folder.
"""

from __future__ import annotations

from typing import Any

from ..config.validators import flag, given, integer, positive_number
from .model_config import SCORING_FUNCS, TOPK_METHODS

#: Per family, the value of each MoE key when ``config.json`` lacks it (transformers'
#: ``DeepseekV3Config`` / ``Glm4MoeConfig`` defaults; both route by sigmoid + ``noaux_tc``).
MOE_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v3": dict(
        n_routed_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, n_shared_experts=1,
        n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True,
        first_k_dense_replace=3, scoring_func="sigmoid", topk_method="noaux_tc",
    ),
    "glm4_moe": dict(
        n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=1408, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
        first_k_dense_replace=1, scoring_func="sigmoid", topk_method="noaux_tc",
    ),
}  # fmt: skip

#: Integer keys and the least value each may take.
_INT_MINIMUM = dict(
    n_routed_experts=1, num_experts_per_tok=1, moe_intermediate_size=1, n_shared_experts=0,
    n_group=1, topk_group=1, first_k_dense_replace=0,
)  # fmt: skip


def _int(raw: dict[str, Any], key: str, default: int) -> int:
    return integer(given(raw, key, default), f"config.json `{key}`", _INT_MINIMUM[key])


def _choice(raw: dict[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    value = given(raw, key, default)
    if value not in allowed:
        raise ValueError(
            f"config.json `{key}` {value!r} is not supported; supported: {list(allowed)}"
        )
    return str(value)


def moe_fields(raw: dict[str, Any], family: str) -> dict[str, Any]:
    """The MoE :class:`ModelConfig` fields of ``family``'s ``config.json`` object ``raw``.

    Raises:
        ValueError: a key of the wrong type or out of range, or keys that contradict each
            other (``num_experts_per_tok`` above ``n_routed_experts``, ``n_group`` not dividing
            it, ``topk_group`` above ``n_group``, ``noaux_tc`` with groups of one expert,
            fewer experts in the kept groups than ``num_experts_per_tok``).
    """
    defaults = MOE_DEFAULTS[family]
    fields: dict[str, Any] = {key: _int(raw, key, defaults[key]) for key in _INT_MINIMUM}
    for key, check in (("routed_scaling_factor", positive_number), ("norm_topk_prob", flag)):
        fields[key] = check(given(raw, key, defaults[key]), f"config.json `{key}`")
    fields["scoring_func"] = _choice(raw, "scoring_func", defaults["scoring_func"], SCORING_FUNCS)
    fields["topk_method"] = _choice(raw, "topk_method", defaults["topk_method"], TOPK_METHODS)
    _check_routing(fields)
    return fields


def _check_routing(fields: dict[str, Any]) -> None:
    """Refuse MoE keys that are each valid but cannot route together."""
    e, k, groups, kept = (
        fields[n] for n in ("n_routed_experts", "num_experts_per_tok", "n_group", "topk_group")
    )
    if k > e:
        raise ValueError(
            f"config.json `num_experts_per_tok` ({k}) must be <= `n_routed_experts` ({e})"
        )
    if e % groups != 0:
        raise ValueError(f"config.json `n_group` ({groups}) must divide `n_routed_experts` ({e})")
    if kept > groups:
        raise ValueError(f"config.json `topk_group` ({kept}) must be <= `n_group` ({groups})")
    if fields["topk_method"] == "noaux_tc" and e // groups < 2:
        raise ValueError(
            f"config.json `n_group` ({groups}) leaves groups of one expert; `noaux_tc` scores a "
            "group by its best two experts"
        )
    if fields["topk_method"] != "greedy" and kept * (e // groups) < k:
        raise ValueError(
            f"config.json `topk_group` ({kept}) keeps {kept * (e // groups)} experts, fewer than "
            f"`num_experts_per_tok` ({k})"
        )


def glm_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The GLM-4.5 attention fields of a ``glm4_moe`` ``config.json`` object: ``attention_bias``
    and ``use_qk_norm`` (false when absent), ``partial_rotary_factor`` (in ``rope_parameters``
    / ``rope_scaling`` or at the top level; 0.5 when absent, transformers' default for the
    family).

    Raises:
        ValueError: a flag that is not true/false, or a factor outside ``(0, 1]``.
    """
    fields: dict[str, Any] = {}
    for key, field in (("attention_bias", "attention_bias"), ("use_qk_norm", "qk_norm")):
        fields[field] = flag(given(raw, key, False), f"config.json `{key}`")
    rope: Any = raw.get("rope_parameters")
    if not isinstance(rope, dict):
        rope = raw.get("rope_scaling")
    rope = rope if isinstance(rope, dict) else {}
    factor = rope.get("partial_rotary_factor", given(raw, "partial_rotary_factor", 0.5))
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise ValueError(
            f"config.json `partial_rotary_factor` must be a number in (0, 1], got {factor!r}"
        )
    fields["partial_rotary_factor"] = float(factor)
    return fields
