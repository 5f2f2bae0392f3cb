"""Configuration of the tiny decoder-only target model and its MTP layer."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ..config import typed_keys
from ..config.validators import one_of
from .hybrid_config import HybridSpec

#: Values accepted by :attr:`ModelConfig.mtp_hidden_state`.
MTP_HIDDEN_STATES = ("post_norm", "pre_norm")
#: Values accepted by :attr:`ModelConfig.mtp_concat_order`.
MTP_CONCAT_ORDERS = ("emb_first", "hidden_first")
#: Values accepted by :attr:`ModelConfig.mtp_final_norm`.
MTP_FINAL_NORMS = ("in_forward", "in_logits")
#: Values accepted by :attr:`ModelConfig.dtype`.
MODEL_DTYPES = ("float32", "bfloat16", "float16")
#: ``rope_type`` values of :attr:`ModelConfig.rope_scaling`.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
#: Values accepted by :attr:`ModelConfig.attention_type`.
ATTENTION_TYPES = ("gqa", "mla")
#: Values accepted by :attr:`ModelConfig.scoring_func` (MoE router scores).
SCORING_FUNCS = ("sigmoid", "softmax")
#: Values accepted by :attr:`ModelConfig.topk_method` (MoE expert choice).
TOPK_METHODS = ("noaux_tc", "greedy", "group_limited_greedy")
#: :attr:`ModelConfig.model_type` of the shipped byte-level checkpoint.
TINY_MODEL_TYPE = "fastdeploy_mtp_tiny"
#: ``config.json`` ``architectures`` entry of that checkpoint.
TINY_ARCHITECTURE = "FastDeployMTPTinyForCausalLM"


@dataclass
class ModelConfig:
    """Shape and behaviour of a target model and its MTP layer.

    Attributes:
        vocab_size: rows of the embedding / columns of the LM head, padded (e.g. 272).
        ori_vocab_size: the real vocabulary (e.g. 256 bytes); logits columns
            ``>= ori_vocab_size`` are set to ``-inf`` by ``compute_logits``.
        hidden_size: model width H.
        num_hidden_layers: decoder layers of the target model (the MTP layer is extra).
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (grouped-query attention); must divide
            ``num_attention_heads``.
        head_dim: per-head width; defaults to ``hidden_size // num_attention_heads``
            (MLA: ``qk_rope_head_dim``, the width RoPE tables cover).
        intermediate_size: SwiGLU inner width.
        rms_norm_eps: epsilon of every RMSNorm.
        rope_theta: RoPE base; rotation is the "rotate half" (GPT-NeoX / Llama) layout.
        max_position_embeddings: size of the precomputed RoPE table; positions must be below it.
        mtp_hidden_state: which target hidden state the MTP layer consumes and which the
            target's ``forward`` returns: ``"post_norm"`` (after the final RMSNorm, as
            FastDeploy's ERNIE-4.5 does) or ``"pre_norm"`` (the residual stream before it).
            ``compute_logits`` of the target applies the final norm only in the
            ``"pre_norm"`` case, so ``compute_logits(forward(...))`` is the same either way.
        mtp_concat_order: ``"emb_first"`` (``eh_proj(cat[enorm(e), hnorm(h)])``, DeepSeek,
            GLM, ERNIE, Qwen) or ``"hidden_first"`` (MiMo).
        block_size: tokens per KV-cache block of the paged attention backend.
        attention_bias: whether ``q_proj``/``k_proj``/``v_proj`` have biases (Qwen2-style
            blocks such as MiMo's and GLM-4.5's have them; the shipped model does not).
        mtp_final_norm: where the MTP layer applies its final norm: ``"in_forward"`` (its
            ``forward`` returns the normed state, which later substeps feed back; ERNIE,
            Qwen3-Next, MiMo) or ``"in_logits"`` (``forward`` returns the un-normed state and
            ``compute_logits`` applies the norm; FastDeploy's GLM-4.5, DeepSeek's
            ``shared_head.norm``).
        num_nextn_predict_layers: distinct MTP layers the checkpoint carries (DeepSeek-V3's
            name; 0 = a target model without MTP layers, which serves without MTP drafting).
            Substep ``s`` (0-based) of a round runs layer ``s % num_nextn_predict_layers``
            by default (see ``SpeculativeConfig.mtp_layer_schedule``); each layer has its own KV
            cache.
        model_type: the family (``config.json``'s ``model_type``): :data:`TINY_MODEL_TYPE`
            for the shipped checkpoint, ``"llama"``, ``"qwen2"``, ``"qwen3"``, ``"mimo"``.
        qk_norm: per-head RMSNorm of queries and keys before RoPE (Qwen3's ``q_norm``/``k_norm``).
        tie_word_embeddings: the LM head is the embedding matrix (no ``lm_head`` weight).
        rope_scaling: ``None`` (plain RoPE) or ``{"rope_type": one of :data:`ROPE_TYPES`, ...}``
            with that type's parameters (``factor``, ``original_max_position_embeddings``, ...).
        dtype: parameters, activations and KV caches (one of :data:`MODEL_DTYPES`); logits
            and the hidden states handed to the proposer are float32.
        eos_token_ids: token ids that end a generation (from ``generation_config.json`` /
            ``config.json``); the byte model's is ``[256]``, ``<|endoftext|>``.
        attention_type: ``"gqa"`` (grouped-query attention, a key and a value cache per layer)
            or ``"mla"`` (DeepSeek's multi-head latent attention, one latent cache per layer).
        partial_rotary_factor: the share of each head's dimensions RoPE rotates (GLM-4.5: 0.5,
            the first ``head_dim * factor`` dimensions); 1.0 = the whole head.
        q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: MLA's
            shapes (DeepSeek-V3's names; ``q_lora_rank`` 0 = a plain ``q_proj``).
        n_routed_experts: MoE experts per MoE layer (0 = dense MLP everywhere).
        num_experts_per_tok, moe_intermediate_size, n_shared_experts, n_group, topk_group,
            routed_scaling_factor, norm_topk_prob, first_k_dense_replace, scoring_func,
            topk_method: the MoE router and experts (DeepSeek-V3 / GLM-4.5 names; layers below
            ``first_k_dense_replace`` keep a dense MLP of ``intermediate_size``).
        mtp_mask_first_position: the MTP layers zero the token embedding at position 0. Off
            for every family: after the one-token shift row 0 holds a real token (``t_1``),
            and transformers' MTP generation feeds it. Only a checkpoint trained with the
            mask sets it (``config.json`` ``mtp_mask_first_position: true``; the shipped tiny
            DeepSeek-V3 checkpoint was).
        rope_interleave: RoPE rotates interleaved pairs ``(x0, x1), (x2, x3), ...`` (GPT-J
            style) instead of halves: MLA's rope parts (DeepSeek-V3 checkpoints; see
            :mod:`~fastdeploy_mtp.models.mla`) and grouped-query heads (ERNIE-4.5; see
            :func:`~fastdeploy_mtp.models.layers.apply_rope`).
        moe_layer_interval, moe_layer_start_index, moe_layer_end_index: ERNIE-4.5's choice of
            MoE layers (``moe_layer_interval`` 0 = not used: ``first_k_dense_replace`` decides).
            With an interval, decoder layer ``i`` has the MoE MLP iff ``(i + 1) % interval == 0``
            and ``start <= i <= end``; MTP layer ``k`` counts as ``i = k`` (transformers builds it
            as layer ``k`` of the MTP config, see :meth:`is_moe_layer`).
        moe_norm_min: how the chosen experts' weights are normalised (``norm_topk_prob``):
            0 = divided by ``sum + 1e-20`` (DeepSeek-V3, GLM-4.5); > 0 = divided by
            ``max(sum, moe_norm_min)`` (ERNIE-4.5's ``moe_norm_min``).
        moe_statics: the router's correction bias is ERNIE-4.5's ``mlp.moe_statics.
            e_score_correction_bias`` of shape ``[1, E]`` (else ``mlp.gate.
            e_score_correction_bias`` of shape ``[E]``).
        hybrid: the linear/full-attention layout of Qwen3-Next and Qwen3.5
            (:class:`~fastdeploy_mtp.models.hybrid_config.HybridSpec`); ``None`` for every
            other family.
    """

    vocab_size: int = 272
    ori_vocab_size: int = 256
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 0
    intermediate_size: int = 352
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    mtp_hidden_state: str = "post_norm"
    mtp_concat_order: str = "emb_first"
    block_size: int = 16
    attention_bias: bool = False
    mtp_final_norm: str = "in_forward"
    num_nextn_predict_layers: int = 1
    model_type: str = TINY_MODEL_TYPE
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    rope_scaling: dict[str, Any] | None = None
    dtype: str = "float32"
    eos_token_ids: list[int] = dataclasses.field(default_factory=list)
    attention_type: str = "gqa"
    partial_rotary_factor: float = 1.0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = False
    first_k_dense_replace: int = 0
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    mtp_mask_first_position: bool = False
    rope_interleave: bool = False
    moe_layer_interval: int = 0
    moe_layer_start_index: int = 0
    moe_layer_end_index: int = 0
    moe_norm_min: float = 0.0
    moe_statics: bool = False
    hybrid: HybridSpec | None = None

    def __post_init__(self) -> None:
        if self.head_dim == 0 and self.attention_type == "mla":
            self.head_dim = self.qk_rope_head_dim  # MLA's RoPE width (transformers' head_dim too)
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent field."""
        for name in (
            "vocab_size",
            "ori_vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
            "block_size",
        ):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}")
        if int(self.num_nextn_predict_layers) < 0:
            raise ValueError(
                f"`num_nextn_predict_layers` must be >= 0, got {self.num_nextn_predict_layers}"
            )
        one_of(self.dtype, MODEL_DTYPES, "`dtype`")
        if self.rope_scaling is not None:
            one_of(self.rope_scaling.get("rope_type"), ROPE_TYPES, "`rope_scaling.rope_type`")
        if self.num_hidden_layers < 0:
            raise ValueError(f"`num_hidden_layers` must be >= 0, got {self.num_hidden_layers}")
        if self.ori_vocab_size > self.vocab_size:
            raise ValueError(
                f"`ori_vocab_size` ({self.ori_vocab_size}) must be <= "
                f"`vocab_size` ({self.vocab_size})"
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"`num_attention_heads` ({self.num_attention_heads}) must be a "
                f"multiple of `num_key_value_heads` ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"`head_dim` must be even for RoPE, got {self.head_dim}")
        one_of(self.mtp_hidden_state, MTP_HIDDEN_STATES, "`mtp_hidden_state`")
        one_of(self.mtp_concat_order, MTP_CONCAT_ORDERS, "`mtp_concat_order`")
        one_of(self.mtp_final_norm, MTP_FINAL_NORMS, "`mtp_final_norm`")
        self._validate_attention()
        self._validate_moe()

    def _validate_attention(self) -> None:
        one_of(self.attention_type, ATTENTION_TYPES, "`attention_type`")
        if not 0.0 < float(self.partial_rotary_factor) <= 1.0:
            raise ValueError(
                f"`partial_rotary_factor` must be in (0, 1], got {self.partial_rotary_factor}"
            )
        rotary = self.head_dim * self.partial_rotary_factor
        if int(rotary) % 2 != 0:
            raise ValueError(
                f"`head_dim * partial_rotary_factor` must be even for RoPE, got {rotary}"
            )
        if (
            self.rope_interleave
            and self.attention_type == "gqa"
            and self.partial_rotary_factor != 1.0
        ):
            raise ValueError(
                "`rope_interleave` with grouped-query attention needs `partial_rotary_factor` 1"
            )
        if self.attention_type == "mla":
            for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if int(getattr(self, name)) <= 0:
                    raise ValueError(
                        f"`{name}` must be positive for MLA attention, got {getattr(self, name)}"
                    )
            if self.qk_rope_head_dim % 2 != 0:
                raise ValueError(
                    f"`qk_rope_head_dim` must be even for RoPE, got {self.qk_rope_head_dim}"
                )
            if self.head_dim != self.qk_rope_head_dim:
                raise ValueError(
                    f"`head_dim` ({self.head_dim}) must equal "
                    f"`qk_rope_head_dim` ({self.qk_rope_head_dim}) for MLA"
                )
            if self.q_lora_rank < 0:
                raise ValueError(
                    f"`q_lora_rank` must be >= 0 (0: a plain q_proj), got {self.q_lora_rank}"
                )

    def _validate_moe(self) -> None:
        e = int(self.n_routed_experts)
        if e < 0:
            raise ValueError(f"`n_routed_experts` must be >= 0, got {e}")
        if e == 0:
            return
        if not 1 <= self.num_experts_per_tok <= e:
            raise ValueError(
                f"`num_experts_per_tok` must be in [1, {e}], got {self.num_experts_per_tok}"
            )
        if self.moe_intermediate_size <= 0:
            raise ValueError(
                f"`moe_intermediate_size` must be positive, got {self.moe_intermediate_size}"
            )
        if self.n_shared_experts < 0 or self.first_k_dense_replace < 0:
            raise ValueError("`n_shared_experts` and `first_k_dense_replace` must be >= 0")
        if self.n_group < 1 or e % self.n_group != 0:
            raise ValueError(f"`n_group` ({self.n_group}) must divide `n_routed_experts` ({e})")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"`topk_group` must be in [1, n_group={self.n_group}], got {self.topk_group}"
            )
        one_of(self.scoring_func, SCORING_FUNCS, "`scoring_func`")
        one_of(self.topk_method, TOPK_METHODS, "`topk_method`")
        if self.moe_layer_interval < 0 or self.moe_norm_min < 0:
            raise ValueError("`moe_layer_interval` and `moe_norm_min` must be >= 0")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (MTP layers count from ``num_hidden_layers``) has
        an MoE MLP rather than a dense one.

        DeepSeek-V3 / GLM-4.5: every layer from ``first_k_dense_replace`` on, MTP layers
        included. ERNIE-4.5 (``moe_layer_interval > 0``): layer ``i`` when
        ``(i + 1) % moe_layer_interval == 0`` and ``moe_layer_start_index <= i <=
        moe_layer_end_index``; MTP layer ``k`` (``layer = num_hidden_layers + k``) is judged as
        ``i = k``, since transformers builds it as decoder layer ``k`` of its MTP config (so
        with ``moe_layer_start_index >= 1`` the first MTP block is dense)."""
        if self.n_routed_experts <= 0:
            return False
        if self.hybrid is not None:  # Qwen3-Next: MTP layer k counts as k (vLLM's layer names)
            n = self.num_hidden_layers
            return self.hybrid.is_sparse(layer - n if layer >= n else layer)
        if self.moe_layer_interval > 0:
            i = layer - self.num_hidden_layers if layer >= self.num_hidden_layers else layer
            in_range = self.moe_layer_start_index <= i <= self.moe_layer_end_index
            return (i + 1) % self.moe_layer_interval == 0 and in_range
        return layer >= self.first_k_dense_replace

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """A config from its JSON object: unknown keys refused (all named at once), then each
        value's type checked against the field's (``"128"`` is not an integer), then the
        ranges (:meth:`validate`); every refusal is a ``ValueError`` naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {unknown}")
        return cls(**typed_keys(cls, data, "model config"))

    def save_json(self, path: str) -> None:
        """Write the fields as ``config.json``; a :data:`TINY_MODEL_TYPE` config also gets
        ``architectures`` so the folder loads with ``load_model``."""
        data: dict[str, Any] = self.to_dict()
        if self.model_type == TINY_MODEL_TYPE:
            data["architectures"] = [TINY_ARCHITECTURE]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load_json(cls, path: str) -> ModelConfig:
        """The config in a :data:`TINY_MODEL_TYPE` folder's ``config.json`` (its fields plus
        ``architectures``). Other families' configs need translating: use
        ``fastdeploy_mtp.models.inspect_model_folder``.

        Raises:
            ValueError: the file is another family's ``config.json`` (naming its ``model_type``),
                or a field is unknown or invalid.
        """
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if isinstance(data, dict):
            model_type = data.get("model_type", TINY_MODEL_TYPE)
            if model_type != TINY_MODEL_TYPE:
                raise ValueError(
                    f"{path}: `model_type` {model_type!r} is not {TINY_MODEL_TYPE!r}; "
                    "read it with fastdeploy_mtp.models.inspect_model_folder"
                )
            data = {k: v for k, v in data.items() if k != "architectures"}
        return cls.from_dict(data)


def has_linear_attention(config: object) -> bool:
    """Whether ``config`` (a :class:`ModelConfig`) has linear-attention layers (Gated DeltaNet,
    ``layer_types`` ``"linear_attention"``: Qwen3-Next, Qwen3.5), whose per-sequence recurrent
    state a paged KV block does not hold: prefix caching and a splitwise hand-over, which move
    only KV blocks, cannot serve such a model."""
    hybrid = getattr(config, "hybrid", None)
    return hybrid is not None and hybrid.num_linear_layers > 0
