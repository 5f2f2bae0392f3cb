"""Where each family's checkpoints keep their MTP layer: :class:`FamilySpec` (the fusion
tensors' names, the decoder block's prefix, the Linear layout, the concat order, where the
final norm applies, the zero-centred norms, the shared embedding and LM head) and
:data:`FAMILIES`, the supported ones. Pure data: no framework is imported."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .ernie_config import ernie_mtp_names
from .model_config import ModelConfig


@dataclass(frozen=True)
class FamilySpec:
    """Where one model family keeps its MTP layer and how to read it.

    Attributes:
        name: family key (``"deepseek_v3"``, ...).
        prefix: prefix of every MTP-owned tensor; ``{index}`` is the checkpoint layer index.
        index_regex: regex that finds ``{index}`` among checkpoint names (families whose MTP
            layer sits at ``model.layers.{num_hidden_layers}``); ``None`` if fixed.
        fusion: our parameter name -> checkpoint name (relative to ``prefix``) for
            ``enorm``, ``hnorm``, ``eh_proj`` and the final ``norm``. A name starting with
            ``/`` is absolute (ERNIE's final norm is the main model's ``ernie.norm``).
        block: prefix of the decoder block, relative to ``prefix``.
        torch_layout: Linear weights stored ``[out, in]``; transposed on load.
        concat_order: ``"emb_first"`` or ``"hidden_first"`` (MiMo).
        final_norm: ``"in_forward"`` or ``"in_logits"`` (see ``ModelConfig.mtp_final_norm``).
        hidden_state: the target hidden state the family's MTP layer consumes.
        norm_offset: added to every RMSNorm weight on load (1.0 for Qwen3-Next, whose norms
            compute ``x_normed * (1 + w)``).
        embed: checkpoint names (absolute) that may hold the shared embedding, first found wins.
        head: checkpoint names (absolute) that may hold the shared LM head.
        owned_prefixes: absolute prefixes whose every tensor must be consumed (anything left
            over is unsupported).
    """

    name: str
    prefix: str
    fusion: dict[str, str]
    owned_prefixes: tuple[str, ...]
    index_regex: str | None = None
    block: str = ""
    torch_layout: bool = True
    concat_order: str = "emb_first"
    final_norm: str = "in_forward"
    hidden_state: str = "post_norm"
    norm_offset: float = 0.0
    embed: tuple[str, ...] = ("model.embed_tokens.weight",)
    head: tuple[str, ...] = ("lm_head.weight",)


def _fusion(enorm: str, hnorm: str, eh_proj: str, norm: str) -> dict[str, str]:
    """:attr:`FamilySpec.fusion` from the checkpoint names of the four fusion tensors."""
    return {"enorm": enorm, "hnorm": hnorm, "eh_proj": eh_proj, "norm": norm}


def _deepseek_style(name: str) -> FamilySpec:
    """DeepSeek-V3 and GLM-4.5: the MTP layer is ``model.layers.{num_hidden_layers}``."""
    return FamilySpec(
        name=name,
        prefix="model.layers.{index}.",
        index_regex=r"^model\.layers\.(\d+)\.enorm\.weight$",
        fusion=_fusion("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"),
        final_norm="in_logits",
        embed=("model.layers.{index}.embed_tokens.weight", "model.embed_tokens.weight"),
        head=("model.layers.{index}.shared_head.head.weight", "lm_head.weight"),
        owned_prefixes=("model.layers.{index}.",),
    )


def _ernie_style(name: str, prefix: str, torch_layout: bool) -> FamilySpec:
    """ERNIE-4.5's MTP layer 0 (:func:`ernie_mtp_names`), Paddle layout (``ernie4_5``) or the
    HuggingFace "-PT" folders' torch layout (``ernie4_5_pt``, LM head tied by default)."""
    names = ernie_mtp_names(prefix, 0)
    local = {part: names[part][len(prefix) :] for part in ("enorm", "hnorm", "eh_proj")}
    return FamilySpec(
        name=name,
        prefix=prefix,
        block=names["block"][len(prefix) :],
        torch_layout=torch_layout,
        embed=(f"{prefix}embed_tokens.weight",),
        head=("lm_head.weight", f"{prefix}embed_tokens.weight")
        if torch_layout
        else ("lm_head.weight",),
        owned_prefixes=(f"{prefix}mtp_",),
        fusion=_fusion(local["enorm"], local["hnorm"], local["eh_proj"], "/" + names["norm"]),
    )


#: The supported checkpoint families (fields left out take :class:`FamilySpec`'s defaults).
FAMILIES: dict[str, FamilySpec] = {
    "ernie4_5": _ernie_style("ernie4_5", "ernie.", torch_layout=False),
    "ernie4_5_pt": _ernie_style("ernie4_5_pt", "model.", torch_layout=True),
    "deepseek_v3": _deepseek_style("deepseek_v3"),
    "glm4_5": _deepseek_style("glm4_5"),
    "qwen3_next": FamilySpec(
        name="qwen3_next",
        prefix="mtp.",
        block="layers.0.",
        norm_offset=1.0,
        owned_prefixes=("mtp.",),
        fusion=_fusion(
            "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "fc.weight", "norm.weight"
        ),
    ),
    "mimo": FamilySpec(
        name="mimo",
        prefix="model.mtp_layers.0.",
        concat_order="hidden_first",
        owned_prefixes=("model.mtp_layers.",),
        fusion=_fusion(
            "token_layernorm.weight",
            "hidden_layernorm.weight",
            "input_proj.weight",
            "final_layernorm.weight",
        ),
    ),
}

#: Checkpoint-name fragments under an MTP prefix that this model cannot use, and why.
UNSUPPORTED_HINTS = (
    ("experts", "MoE experts are out of scope: only dense SwiGLU MLP blocks are supported"),
    ("mlp.gate.", "MoE routers are out of scope: only dense SwiGLU MLP blocks are supported"),
    ("shared_expert", "MoE shared experts are out of scope"),
    ("q_a_proj", "MLA attention is out of scope: only GQA q/k/v/o projections are supported"),
    ("kv_a_proj", "MLA attention is out of scope: only GQA q/k/v/o projections are supported"),
    ("kv_b_proj", "MLA attention is out of scope: only GQA q/k/v/o projections are supported"),
    ("q_norm", "per-head q/k norms are out of scope"),
    ("k_norm", "per-head q/k norms are out of scope"),
)


def get_family(family: str) -> FamilySpec:
    """Return the :class:`FamilySpec` for ``family`` or raise ``ValueError`` listing them."""
    if family not in FAMILIES:
        raise ValueError(f"unknown checkpoint family {family!r}; supported: {sorted(FAMILIES)}")
    return FAMILIES[family]


def config_for_family(family: str, base: ModelConfig) -> ModelConfig:
    """``base`` with the family's layout fields set: ``mtp_concat_order``,
    ``mtp_final_norm`` and ``mtp_hidden_state``."""
    spec = get_family(family)
    return dataclasses.replace(
        base,
        mtp_concat_order=spec.concat_order,
        mtp_final_norm=spec.final_norm,
        mtp_hidden_state=spec.hidden_state,
    )
