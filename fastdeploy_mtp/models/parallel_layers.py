"""Tensor-parallel building blocks (FastDeploy's layout) and the shard bookkeeping.

Each class holds rank ``tensor_parallel_rank``'s shard of a full weight and declares, in
``shard_axes``, along which axis of each parameter the full tensor is cut into
``tensor_parallel_size`` equal, contiguous pieces (piece ``r`` belongs to rank ``r``); the
loader (:func:`~fastdeploy_mtp.models.loading.load_state_strict`) slices the full checkpoint
with it. Parameters of other layers are replicated.

With ``tensor_parallel_size == 1`` every class computes exactly what the plain
``nn.Linear`` / ``nn.Embedding`` it extends computes (no collective, same kernels).

- :class:`ColumnParallelLinear`: weight ``[in, out/tp]`` (bias ``[out/tp]``); the output stays
  sharded along its last axis (q/k/v by heads, gate/up of the MLP).
- :class:`RowParallelLinear`: weight ``[in/tp, out]``, takes the sharded input and sums the
  partial products over the ranks (``all_reduce``): ``o_proj``, ``down_proj``.
- :class:`VocabParallelEmbedding`: rows ``[V/tp, H]``; a rank looks up the ids in its vocabulary
  slice, writes zeros for the others, and the ranks' results are summed. Exactly one rank
  contributes each row, so the sum is exact (``x + 0 == x``).
- :class:`ParallelLMHead`: weight ``[H, V/tp]``; the ranks' logits are gathered along the
  vocabulary, so every rank gets the full ``[n, V]`` logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .. import distributed

if TYPE_CHECKING:
    from .model_config import ModelConfig


def check_tensor_parallel(
    config: ModelConfig, tensor_parallel_size: int, tensor_parallel_rank: int = 0
) -> None:
    """Raise ``ValueError`` naming the config field that ``tensor_parallel_size`` does not
    divide (``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
    ``vocab_size``), or the bad size/rank."""
    if tensor_parallel_size < 1:
        raise ValueError(f"`tensor_parallel_size` must be >= 1, got {tensor_parallel_size}")
    if not 0 <= tensor_parallel_rank < tensor_parallel_size:
        raise ValueError(
            f"`tensor_parallel_rank` must be in [0, {tensor_parallel_size}), got "
            f"{tensor_parallel_rank}"
        )
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        value = int(getattr(config, name))
        if value % tensor_parallel_size != 0:
            raise ValueError(
                f"`{name}` ({value}) is not divisible by `tensor_parallel_size` "
                f"({tensor_parallel_size}): each rank must hold {name}/tensor_parallel_size"
            )


def refuse_training_on_shard(tensor_parallel_size: int, owner: str) -> None:
    """Raise ``NotImplementedError`` if ``owner`` (e.g. ``"this model"``) is a shard: the dense
    training path (``forward_dense``) runs unsharded only."""
    if tensor_parallel_size > 1:
        raise NotImplementedError(
            f"forward_dense (training) runs unsharded; {owner} is a tensor-parallel shard "
            f"(tensor_parallel_size={tensor_parallel_size})"
        )


def _local(size: int, tp: int, what: str) -> int:
    if size % tp != 0:
        raise ValueError(f"`{what}` ({size}) is not divisible by `tensor_parallel_size` ({tp})")
    return size // tp


class ColumnParallelLinear(nn.Linear):
    """``y_r = x @ W[:, r*out/tp:(r+1)*out/tp] (+ b_r)``: ``x [..., in]`` replicated ->
    ``[..., out/tp]`` float32, this rank's slice of the output features (no collective).

    Args:
        in_features, out_features: sizes of the full (unsharded) layer.
        tensor_parallel_size: ranks sharing the layer; must divide ``out_features``.
        bias_attr: as ``nn.Linear`` (``False`` = no bias).
    """

    shard_axes = {"weight": 1, "bias": 0}

    def __init__(
        self,
        in_features: int,
        out_features: int,
        tensor_parallel_size: int = 1,
        bias_attr: bool | None = False,
    ):
        super().__init__(
            in_features,
            _local(out_features, tensor_parallel_size, "out_features"),
            bias_attr=bias_attr,
        )
        self.tensor_parallel_size = tensor_parallel_size


class _CollectiveLinear(nn.Linear):
    """A bias-free Linear over this rank's shard whose output, with ``tensor_parallel_size > 1``,
    goes through :meth:`collect` (the collective that makes it the same on every rank)."""

    def __init__(self, in_features: int, out_features: int, tensor_parallel_size: int):
        super().__init__(in_features, out_features, bias_attr=False)
        self.tensor_parallel_size = tensor_parallel_size

    def collect(self, y: paddle.Tensor) -> paddle.Tensor:
        raise NotImplementedError

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = super().forward(x)
        return self.collect(y) if self.tensor_parallel_size > 1 else y


class RowParallelLinear(_CollectiveLinear):
    """``y = sum_r x_r @ W[r*in/tp:(r+1)*in/tp, :]``: ``x_r [..., in/tp]`` (this rank's slice of
    the input features, as a :class:`ColumnParallelLinear` leaves it) -> ``[..., out]`` float32,
    the same on every rank (``all_reduce`` sum). No bias.

    The sum runs in a different order than the unsharded matmul, so results agree with it to
    float32 rounding, not bit for bit.
    """

    shard_axes = {"weight": 0}

    def __init__(self, in_features: int, out_features: int, tensor_parallel_size: int = 1):
        super().__init__(
            _local(in_features, tensor_parallel_size, "in_features"),
            out_features,
            tensor_parallel_size,
        )

    def collect(self, y: paddle.Tensor) -> paddle.Tensor:
        return distributed.all_reduce_sum(y)


class VocabParallelEmbedding(nn.Embedding):
    """Embedding whose rows are split over the ranks: rank ``r`` holds ids
    ``[r*V/tp, (r+1)*V/tp)``. ``ids [...]`` int64 (replicated) -> ``[..., H]`` float32,
    identical on every rank and equal, bit for bit, to the unsharded lookup.

    Args:
        num_embeddings: full vocabulary ``V`` (divisible by ``tensor_parallel_size``).
        embedding_dim: ``H``.
        tensor_parallel_size, tensor_parallel_rank: the layout and this rank.
    """

    shard_axes = {"weight": 0}

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        tensor_parallel_size: int = 1,
        tensor_parallel_rank: int = 0,
    ):
        local = _local(num_embeddings, tensor_parallel_size, "num_embeddings")
        super().__init__(local, embedding_dim)
        self.tensor_parallel_size = tensor_parallel_size
        self.vocab_start = tensor_parallel_rank * local
        self.vocab_end = self.vocab_start + local

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.tensor_parallel_size == 1:
            return super().forward(x)
        mine = paddle.logical_and(x >= self.vocab_start, x < self.vocab_end)
        local_ids = paddle.where(mine, x - self.vocab_start, paddle.zeros_like(x))
        out = F.embedding(local_ids, self.weight)
        out = out * mine.astype(out.dtype).unsqueeze(-1)
        return distributed.all_reduce_sum(out)


class ParallelLMHead(_CollectiveLinear):
    """LM head with its vocabulary columns split over the ranks: weight ``[H, V/tp]``.
    ``hidden [..., H]`` (replicated) -> full logits ``[..., V]`` float32 on every rank (the
    ranks' ``[..., V/tp]`` slices gathered in rank order). No bias."""

    shard_axes = {"weight": 1}

    def __init__(self, hidden_size: int, vocab_size: int, tensor_parallel_size: int = 1):
        super().__init__(
            hidden_size,
            _local(vocab_size, tensor_parallel_size, "vocab_size"),
            tensor_parallel_size,
        )

    def collect(self, y: paddle.Tensor) -> paddle.Tensor:
        return distributed.all_gather_last_axis(y)


class TiedLMHead(nn.Layer):
    """LM head that reads the embedding matrix (``tie_word_embeddings``): ``hidden [..., H]``
    -> ``hidden @ E_r^T`` with ``E_r [V/tp, H]`` this rank's :class:`VocabParallelEmbedding`
    rows, gathered along the vocabulary like :class:`ParallelLMHead` (the embedding's row shard
    is exactly the head's column shard). Owns no parameter."""

    def __init__(self, embedding: VocabParallelEmbedding):
        super().__init__()
        self._embedding = (embedding,)  # a tuple: not registered, the weight stays the embedding's
        self.tensor_parallel_size = embedding.tensor_parallel_size

    @property
    def weight(self) -> paddle.Tensor:
        """The tied matrix ``[V/tp, H]`` (the embedding's weight, not a copy)."""
        return self._embedding[0].weight

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = paddle.matmul(x, self.weight, transpose_y=True)
        return distributed.all_gather_last_axis(y) if self.tensor_parallel_size > 1 else y


def shard_axes(layer: nn.Layer) -> dict[str, int]:
    """``{parameter name (as in layer.named_parameters()): axis}`` for every sharded
    parameter of ``layer``; parameters not listed are replicated."""
    axes: dict[str, int] = {}
    for prefix, sub in layer.named_sublayers(include_self=True):
        for pname, axis in getattr(sub, "shard_axes", {}).items():
            if getattr(sub, pname, None) is not None:
                axes[f"{prefix}.{pname}" if prefix else pname] = axis
    return axes


def kv_cache_shape(
    config: ModelConfig, num_blocks: int, tensor_parallel_size: int = 1
) -> list[int]:
    """Shape of one layer's key (or value) cache on each of ``tensor_parallel_size`` ranks:
    ``[num_blocks, num_key_value_heads / tp, block_size, head_dim]`` (what the rank's
    ``attn_backend.get_kv_cache_shape(num_blocks)`` returns), without building a model.

    Raises:
        ValueError: ``num_blocks <= 0``, or a config field ``tensor_parallel_size`` does not divide.
    """
    check_tensor_parallel(config, tensor_parallel_size)
    if num_blocks <= 0:
        raise ValueError(f"`num_blocks` must be positive, got {num_blocks}")
    return [
        int(num_blocks),
        config.num_key_value_heads // tensor_parallel_size,
        config.block_size,
        config.head_dim,
    ]
