"""The MTP (multi-token-prediction) layer: one extra decoder layer that predicts the token
after next from the next token's embedding and the target's hidden state."""

from __future__ import annotations

import paddle
import paddle.nn as nn

from .attention import ReferenceAttentionBackend
from .forward_meta import ForwardMeta
from .hybrid_layers import decoder_block, norm_for
from .latent_attention import LatentAttentionBackend
from .layers import DenseStep, PagedStep, RotaryEmbedding
from .mla import attention_backend
from .model_config import ModelConfig
from .parallel_layers import refuse_training_on_shard
from .target import TinyTargetModel, mask_padded_vocab


class MTPLayer(nn.Layer):
    """``eh_proj(cat[enorm(embed(ids)), hnorm(prev_hidden)])`` -> :class:`DecoderLayer`
    (``mtp_block``) -> ``norm`` -> the target's ``lm_head``.

    The embedding and the LM head are the target model's modules (shared, not copied, and
    not part of this layer's ``state_dict``/``parameters()``). ``eh_proj`` is ``[2H, H]``
    (Paddle ``[in, out]`` layout); with ``config.mtp_concat_order == "hidden_first"`` (MiMo)
    the concatenation is ``cat[hnorm(h), enorm(e)]`` instead.

    Convention: at position ``p`` the MTP layer is fed token ``t_{p+1}`` and the target's
    hidden state ``h_p`` (which already predicted ``t_{p+1}``) and predicts ``t_{p+2}``. Its KV
    cache is its own (one layer, ``forward_meta.caches[0:2]``) and its positions are ``p``.
    ``forward`` returns the post-``norm`` hidden state (or the pre-``norm`` one when
    ``config.mtp_final_norm == "in_logits"``), which is also what later MTP substeps feed
    back as ``previous_hidden_states``.

    With ``config.mtp_mask_first_position`` (off unless a checkpoint was trained so) the token
    embedding of every row at position 0 is zeroed before ``enorm``, in every forward (packed
    and dense).

    Tensor parallelism follows the target (``target.tensor_parallel_size``): ``mtp_block`` is
    split like the target's decoder layers, its ``attn_backend`` covers this rank's key/value
    heads, and ``enorm``/``hnorm``/``eh_proj``/``norm`` are replicated. An MLA layer
    (``config.attention_type == "mla"``) has one latent cache instead of a key/value pair.

    ``index`` is the layer's place among the MTP layers (``k``); its block counts as decoder
    layer ``num_hidden_layers + k``, so it has an MoE MLP when the model has experts.
    """

    def __init__(self, config: ModelConfig, target: TinyTargetModel, index: int = 0):
        super().__init__()
        if (
            target.config.hidden_size != config.hidden_size
            or target.config.vocab_size != config.vocab_size
        ):
            raise ValueError("`target` must have the same hidden_size and vocab_size as `config`")
        self.config = config
        tp = target.tensor_parallel_size
        self.tensor_parallel_size = tp
        h = config.hidden_size
        self.enorm = norm_for(config, h)
        self.hnorm = norm_for(config, h)
        self.eh_proj = nn.Linear(2 * h, h, bias_attr=False)
        self.mtp_block = decoder_block(config, tp, config.num_hidden_layers + index)
        self.norm = norm_for(config, h)
        self.rotary = RotaryEmbedding.of(config)
        self.attn_backend = attention_backend(config, tp)
        # A plain tuple is not registered as a sublayer: shared weights stay owned by the target.
        self._shared = (target,)
        #: Index of this layer's key/value pair (or latent cache) in ``forward_meta.caches``
        #: (set by :class:`MTPStack` for its layers; a lone layer uses 0).
        self.cache_layer = 0

    @property
    def target(self) -> TinyTargetModel:
        return self._shared[0]

    @property
    def num_cache_layers(self) -> int:
        return 1

    def _fuse(self, emb: paddle.Tensor, hidden: paddle.Tensor) -> paddle.Tensor:
        e = self.enorm(emb)
        h = self.hnorm(hidden)
        parts = [e, h] if self.config.mtp_concat_order == "emb_first" else [h, e]
        return self.eh_proj(paddle.concat(parts, axis=-1))

    def forward(
        self,
        ids_remove_padding: paddle.Tensor | None,
        previous_hidden_states: paddle.Tensor,
        forward_meta: ForwardMeta,
    ) -> paddle.Tensor:
        """Run the packed batch.

        Args:
            ids_remove_padding: ``[T]`` int64, token ``t_{p+1}`` for each packed row
                (``None`` = ``forward_meta.ids_remove_padding``).
            previous_hidden_states: ``[T, H]`` float32, the target's (or the previous MTP
                substep's) hidden state for each row.
            forward_meta: batch metadata whose ``caches`` are this layer's two tensors.

        Returns:
            ``[T, H]`` float32 post-norm hidden states.
        """
        if ids_remove_padding is None:
            ids_remove_padding = forward_meta.ids_remove_padding
        t = int(ids_remove_padding.shape[0])
        if list(previous_hidden_states.shape) != [t, self.config.hidden_size]:
            raise ValueError(
                f"`previous_hidden_states` must be [{t}, "
                f"{self.config.hidden_size}], got "
                f"{list(previous_hidden_states.shape)}"
            )
        plan = forward_meta.build_plan()
        if plan.max_position is not None:  # validated on the host (ForwardMeta.check)
            self.rotary.check_position(plan.max_position)
        cos, sin = self.rotary.lookup(plan.positions, check=False)
        emb = self.target.embed_tokens(ids_remove_padding)
        if self.config.mtp_mask_first_position:
            emb = emb * (plan.positions != 0).astype(emb.dtype).unsqueeze(1)
        x = self._fuse(emb, self.target.to_model_dtype(previous_hidden_states))
        step = PagedStep(cos, sin, self.attn_backend, forward_meta)
        out = self.finish(self.mtp_block(x, step, self.cache_layer))
        return out if out.dtype == paddle.float32 else out.astype("float32")

    def finish(self, x: paddle.Tensor) -> paddle.Tensor:
        """The block's output -> what ``forward`` returns: ``norm(x)`` when
        ``config.mtp_final_norm == "in_forward"``, else ``x`` (``compute_logits`` norms it)."""
        return self.norm(x) if self.config.mtp_final_norm == "in_forward" else x

    def compute_logits(
        self, hidden: paddle.Tensor, forward_meta: ForwardMeta | None = None
    ) -> paddle.Tensor:
        """``hidden [n, H]`` -> float32 ``[n, V]`` through the shared LM head, columns
        ``>= ori_vocab_size`` set to ``-inf``. Applies ``norm`` first when
        ``config.mtp_final_norm == "in_logits"``."""
        hidden = self.target.to_model_dtype(hidden)
        if self.config.mtp_final_norm == "in_logits":
            hidden = self.norm(hidden)
        return mask_padded_vocab(self.target.lm_head(hidden), self.config.ori_vocab_size)

    def empty_input_forward(self, forward_meta: ForwardMeta | None = None) -> None:
        """No-op. A proposer calls it on a rank with no tokens this substep. Every layer here --
        dense, MoE (experts split by their intermediate dimension, one all-reduce) and MLA --
        runs the same tokens on every tensor-parallel rank, so a rank without tokens is a
        batch without tokens on all of them and no collective is left waiting. Expert
        parallelism (each rank its own experts, all-to-all dispatch) would need this to join
        the collectives; it is not implemented."""
        return None

    def forward_dense(
        self, next_ids: paddle.Tensor, hidden: paddle.Tensor, bias: paddle.Tensor
    ) -> paddle.Tensor:
        """Training path: ``next_ids [B, S]`` (tokens ``t_{p+1}``), ``hidden [B, S, H]`` (target
        ``h_p``), causal ``bias`` -> ``[B, S, H]`` (normed as ``forward`` is). Unsharded only
        (raises ``NotImplementedError`` on a tensor-parallel shard)."""
        refuse_training_on_shard(self.tensor_parallel_size, "this MTP layer")
        seq = int(next_ids.shape[1])
        x = self._fuse(self.embed_dense(next_ids), hidden)
        return self.finish(
            self.mtp_block.forward_dense(x, DenseStep(*self.rotary.prefix(seq), bias))
        )

    def embed_dense(self, next_ids: paddle.Tensor) -> paddle.Tensor:
        """Token embeddings ``[B, S, H]`` of ``next_ids [B, S]`` at positions ``0 .. S-1``, column 0
        zeroed under ``config.mtp_mask_first_position``."""
        emb = self.target.embed_tokens(next_ids)
        if self.config.mtp_mask_first_position and int(next_ids.shape[1]) > 0:
            keep = paddle.ones([1, int(next_ids.shape[1]), 1], dtype=emb.dtype)
            keep[:, 0] = 0.0
            emb = emb * keep
        return emb


class MTPStack(nn.Layer):
    """``config.num_nextn_predict_layers`` distinct MTP layers (DeepSeek-V3's sequential MTP
    modules; MiMo ships three), each an :class:`MTPLayer` sharing the target's embedding and
    LM head, each with its own KV cache pair: layer ``i`` uses ``forward_meta.caches[2i:2i+2]``
    (MLA: its latent cache ``forward_meta.caches[i]``).

    The proposer picks the layer of each substep (:attr:`num_layers`, ``forward(...,
    layer=i)``); :meth:`compute_logits` is the same for every layer except for the final norm
    under ``mtp_final_norm == "in_logits"``, so it takes the layer too. Checkpoint names are
    ``layers.{i}.<MTPLayer name>`` under the MTP prefix.
    """

    def __init__(self, config: ModelConfig, target: TinyTargetModel):
        super().__init__()
        if config.num_nextn_predict_layers < 2:
            raise ValueError(
                "MTPStack is for num_nextn_predict_layers >= 2; use MTPLayer for one layer"
            )
        self.config = config
        self.layers = nn.LayerList(
            [MTPLayer(config, target, k) for k in range(config.num_nextn_predict_layers)]
        )
        for i, layer in enumerate(self.layers):
            layer.cache_layer = i
        self.tensor_parallel_size = target.tensor_parallel_size

    @property
    def target(self) -> TinyTargetModel:
        return self.layers[0].target

    @property
    def attn_backend(self) -> ReferenceAttentionBackend | LatentAttentionBackend:
        return self.layers[0].attn_backend

    @property
    def rotary(self) -> RotaryEmbedding:
        return self.layers[0].rotary

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_cache_layers(self) -> int:
        return len(self.layers)

    def forward(
        self,
        ids_remove_padding: paddle.Tensor | None,
        previous_hidden_states: paddle.Tensor,
        forward_meta: ForwardMeta,
        layer: int = 0,
    ) -> paddle.Tensor:
        """:meth:`MTPLayer.forward` of layer ``layer`` (its own cache pair)."""
        if not 0 <= layer < len(self.layers):
            raise ValueError(f"`layer` must be in [0, {len(self.layers)}), got {layer}")
        return self.layers[layer](ids_remove_padding, previous_hidden_states, forward_meta)

    def compute_logits(
        self, hidden: paddle.Tensor, forward_meta: ForwardMeta | None = None, layer: int = 0
    ) -> paddle.Tensor:
        """:meth:`MTPLayer.compute_logits` of layer ``layer``."""
        return self.layers[layer].compute_logits(hidden, forward_meta)

    def empty_input_forward(self, forward_meta: ForwardMeta | None = None) -> None:
        """No-op, as :meth:`MTPLayer.empty_input_forward`."""
        return None


def mtp_layers_of(mtp: MTPLayer | MTPStack) -> list[MTPLayer]:
    """The distinct layers of an MTP model, in substep order."""
    return list(mtp.layers) if isinstance(mtp, MTPStack) else [mtp]


def build_mtp(config: ModelConfig, target: TinyTargetModel) -> MTPLayer | MTPStack | None:
    """An :class:`MTPLayer` for one layer, an :class:`MTPStack` for more, ``None`` when
    ``config.num_nextn_predict_layers == 0`` (a target model without MTP layers)."""
    if config.num_nextn_predict_layers == 0:
        return None
    return (
        MTPStack(config, target)
        if config.num_nextn_predict_layers > 1
        else MTPLayer(config, target)
    )
