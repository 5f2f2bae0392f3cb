"""The tiny decoder-only target model (RMSNorm, RoPE, GQA, SwiGLU)."""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn as nn

from .forward_meta import ForwardMeta
from .hybrid_layers import decoder_block, norm_for
from .layers import DenseStep, PagedStep, RotaryEmbedding
from .mla import attention_backend
from .model_config import ModelConfig
from .parallel_layers import (
    ParallelLMHead,
    TiedLMHead,
    VocabParallelEmbedding,
    check_tensor_parallel,
    refuse_training_on_shard,
)

#: ``(vocab, ori_vocab_size, place) -> [vocab]`` additive masks, built once (a host-to-device
#: copy per logits call was a measurable part of every engine step)
_VOCAB_MASKS: dict[tuple[int, int, str], paddle.Tensor] = {}


def mask_padded_vocab(logits: paddle.Tensor, ori_vocab_size: int) -> paddle.Tensor:
    """Return float32 ``logits [n, V]`` with columns ``>= ori_vocab_size`` set to ``-inf``."""
    logits = logits.astype("float32")
    vocab = int(logits.shape[-1])
    if ori_vocab_size >= vocab:
        return logits
    key = (vocab, int(ori_vocab_size), str(logits.place))
    mask = _VOCAB_MASKS.get(key)
    if mask is None:
        keep = np.zeros([vocab], np.float32)
        keep[ori_vocab_size:] = -np.inf
        mask = _VOCAB_MASKS[key] = paddle.to_tensor(keep, place=logits.place)
    return logits + mask


class TinyTargetModel(nn.Layer):
    """Decoder-only LM: ``embed_tokens [V, H]`` -> ``num_hidden_layers`` x :class:`DecoderLayer`
    -> final ``norm`` -> ``lm_head [H, V]`` (Paddle ``[in, out]`` layout), or the embedding
    matrix itself when ``config.tie_word_embeddings`` (no ``lm_head`` parameter then).

    Parameters and activations are in the default dtype current at construction
    (:func:`~fastdeploy_mtp.models.model_folder.build_models` sets it to ``config.dtype``);
    ``forward`` returns float32 hidden states and ``compute_logits`` float32 logits.

    ``forward`` returns the hidden state the MTP layer consumes, chosen by
    ``config.mtp_hidden_state``: after the final norm (``"post_norm"``, the default and what
    the shipped checkpoint uses) or before it (``"pre_norm"``). ``compute_logits`` accepts
    exactly what ``forward`` returned.

    Tensor parallelism: with ``tensor_parallel_size = tp > 1`` the model holds rank
    ``tensor_parallel_rank``'s shard (vocab-parallel embedding, column/row-parallel attention
    and MLP, vocab-parallel LM head; norms replicated) and must run in a process group set up
    by :func:`fastdeploy_mtp.distributed.init_tensor_parallel`. Inputs, hidden states and
    ``compute_logits`` are the same full tensors on every rank; ``attn_backend`` (and so the
    KV caches) covers this rank's ``num_key_value_heads / tp`` heads.
    """

    def __init__(
        self, config: ModelConfig, tensor_parallel_size: int = 1, tensor_parallel_rank: int = 0
    ):
        super().__init__()
        check_tensor_parallel(config, tensor_parallel_size, tensor_parallel_rank)
        self.config = config
        self.tensor_parallel_size = tensor_parallel_size
        self.tensor_parallel_rank = tensor_parallel_rank
        tp = tensor_parallel_size
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, tp, tensor_parallel_rank
        )
        self.layers = nn.LayerList(
            [decoder_block(config, tp, i) for i in range(config.num_hidden_layers)]
        )
        hybrid = config.hybrid
        if hybrid is not None:
            hybrid.check_tensor_parallel(tp)
        #: per layer, its key/value cache pair (or, for a linear layer, its linear state)
        self.state_ids = hybrid.state_indices() if hybrid else list(range(config.num_hidden_layers))
        self.norm = norm_for(config, config.hidden_size)
        self.lm_head: ParallelLMHead | TiedLMHead
        if config.tie_word_embeddings:
            self.lm_head = TiedLMHead(self.embed_tokens)
        else:
            self.lm_head = ParallelLMHead(config.hidden_size, config.vocab_size, tp)
        self.rotary = RotaryEmbedding.of(config)
        self.attn_backend = attention_backend(config, tp)

    @property
    def num_cache_layers(self) -> int:
        """Layers that own caches in ``forward_meta.caches`` (a key/value pair each, or one
        latent cache each for MLA; see ``attn_backend.cache_kinds``): every layer, or a
        hybrid model's full-attention layers, in layer order."""
        hybrid = self.config.hybrid
        return self.config.num_hidden_layers - (hybrid.num_linear_layers if hybrid else 0)

    def forward(
        self, ids_remove_padding: paddle.Tensor | None, forward_meta: ForwardMeta
    ) -> paddle.Tensor:
        """Run the packed batch.

        Args:
            ids_remove_padding: ``[T]`` int64 new tokens (``None`` = take them from
                ``forward_meta.ids_remove_padding``).
            forward_meta: batch metadata with ``2 * num_hidden_layers`` caches (MLA: one per layer).

        Returns:
            ``[T, H]`` float32 hidden states (post- or pre-final-norm, see the class doc).
        """
        if ids_remove_padding is None:
            ids_remove_padding = forward_meta.ids_remove_padding
        plan = forward_meta.build_plan()
        if int(ids_remove_padding.shape[0]) != plan.num_rows:
            raise ValueError(
                f"`ids_remove_padding` has {int(ids_remove_padding.shape[0])} "
                f"tokens, forward_meta describes {plan.num_rows}"
            )
        if plan.max_position is not None:  # validated on the host (ForwardMeta.check)
            self.rotary.check_position(plan.max_position)
        cos, sin = self.rotary.lookup(plan.positions, check=False)
        step = PagedStep(cos, sin, self.attn_backend, forward_meta)
        h = self.embed_tokens(ids_remove_padding)
        for i, layer in enumerate(self.layers):
            h = layer(h, step, self.state_ids[i])
        if self.config.mtp_hidden_state == "post_norm":
            h = self.norm(h)
        return h if h.dtype == paddle.float32 else h.astype("float32")

    def compute_logits(
        self, hidden: paddle.Tensor, forward_meta: ForwardMeta | None = None
    ) -> paddle.Tensor:
        """``hidden [n, H]`` (as returned by ``forward``) -> float32 ``[n, V]`` logits with the
        padded-vocab tail (columns ``>= ori_vocab_size``) set to ``-inf``."""
        hidden = self.to_model_dtype(hidden)
        if self.config.mtp_hidden_state == "pre_norm":
            hidden = self.norm(hidden)
        return mask_padded_vocab(self.lm_head(hidden), self.config.ori_vocab_size)

    def to_model_dtype(self, x: paddle.Tensor) -> paddle.Tensor:
        """``x`` cast to the parameters' dtype (a no-op for float32 models)."""
        dtype = self.embed_tokens.weight.dtype
        return x if x.dtype == dtype else x.astype(dtype)

    def empty_input_forward(self, forward_meta: ForwardMeta | None = None) -> None:
        """No-op. Exists for interface parity: with MoE under expert parallelism, a rank with
        no tokens must still join the all-to-all collectives of every layer. Dense layers have
        no collectives, and our MoE layers split every expert by tensor parallelism (all ranks
        see the same tokens, one all-reduce each), so there is nothing to do."""
        return None

    def forward_dense(
        self, ids: paddle.Tensor, bias: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Training path over full sequences.

        Args:
            ids: ``[B, S]`` int64.
            bias: ``[S, S]`` (or larger) additive causal mask from
                :func:`~fastdeploy_mtp.models.attention.causal_bias`.

        Returns:
            ``(pre_norm, post_norm)`` hidden states, each ``[B, S, H]`` float32.

        Raises:
            NotImplementedError: on a tensor-parallel shard (training runs unsharded).
        """
        refuse_training_on_shard(self.tensor_parallel_size, "this model")
        if self.config.hybrid is not None:
            raise NotImplementedError("forward_dense (training) does not cover hybrid models")
        seq = int(ids.shape[1])
        step = DenseStep(*self.rotary.prefix(seq), bias)
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer.forward_dense(h, step)
        return h, self.norm(h)

    def mtp_hidden(self, pre_norm: paddle.Tensor, post_norm: paddle.Tensor) -> paddle.Tensor:
        """Pick the hidden state ``forward`` would return (see ``config.mtp_hidden_state``)."""
        return post_norm if self.config.mtp_hidden_state == "post_norm" else pre_norm
