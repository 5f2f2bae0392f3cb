"""The per-sequence state of linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5),
and how speculation rolls it back.

A KV cache is paged by position: a rejected draft's KV sits past the accepted length and is
overwritten later. A recurrent state is not: once it absorbed a rejected draft it is wrong.
So each linear-attention layer keeps, per batch slot, the state after the last token the
slot committed, and, for the rows of a verify pass, the state after *each* of the row's
positions (``*_snapshots``). After verification the engine calls :meth:`LinearStates.commit`
with each slot's accepted count ``a`` (the ``a`` accepted positions are the fed token and
``a - 1`` drafts; the bonus token is fed next round): the slot's state becomes the snapshot
after position ``a - 1``, exactly what plain decoding of the accepted tokens would leave.

Shapes, one rank, float32 (the recurrence is kept in float32 whatever the model dtype):

* ``conv[i]``: ``[max_num_seqs, conv_dim, kernel - 1]``, the last ``kernel - 1`` inputs of
  layer ``i``'s causal depthwise convolution (``conv_dim = 2 * key_dim + value_dim`` of this
  rank's heads); ``conv_snapshots[i]``: ``[max_num_seqs, max_rows, conv_dim, kernel - 1]``.
* ``recurrent[i]``: ``[max_num_seqs, value_heads, head_k_dim, head_v_dim]``, the delta rule's
  state; ``recurrent_snapshots[i]``: ``[max_num_seqs, max_rows, value_heads, head_k_dim,
  head_v_dim]``.

``max_rows = K + 1``, the most tokens one slot feeds in a verify pass. What a linear layer
does with them in a forward (item ``b`` of the batch is slot ``b``):

* ``seq_lens_decoder[b] == 0`` (the first chunk of a prompt): start from zero state;
* a prefill item (``seq_lens_encoder[b] > 0``): run its tokens, store the final state;
* a decode or verify item: run its ``n`` tokens one by one, store the state after token ``j``
  in the snapshots ``[b, j]`` for ``j < n``, and the final state too (so that plain decoding,
  which verifies nothing, needs no commit);
* an item with no tokens: leave its state alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import paddle

from ..config import FDConfig, SpeculativeConfig
from .model_config import ModelConfig


@dataclass
class LinearStates:
    """The states of a model's linear-attention layers on one rank (see the module doc), in
    the order of those layers."""

    conv: list[paddle.Tensor]
    recurrent: list[paddle.Tensor]
    conv_snapshots: list[paddle.Tensor]
    recurrent_snapshots: list[paddle.Tensor]

    @classmethod
    def from_tensors(cls, specs: list[StateSpec], tensors: list[paddle.Tensor]) -> LinearStates:
        """The states of :func:`state_specs` ``specs`` held in ``tensors`` (same order)."""
        by_kind: dict[str, list[paddle.Tensor]] = {kind: [] for kind in STATE_KINDS}
        for spec, tensor in zip(specs, tensors, strict=True):
            by_kind[spec.kind].append(tensor)
        return cls(*(by_kind[kind] for kind in STATE_KINDS))

    def tensors(self) -> list[paddle.Tensor]:
        """Every state tensor, in :func:`state_specs` order (layer by layer)."""
        groups = (self.conv, self.recurrent, self.conv_snapshots, self.recurrent_snapshots)
        return [t for layer in zip(*groups) for t in layer]

    @property
    def max_rows(self) -> int:
        """The most tokens a verify item may feed (``K + 1``)."""
        return int(self.conv_snapshots[0].shape[1]) if self.conv_snapshots else 0

    def commit(self, accept_num: paddle.Tensor, verified: paddle.Tensor) -> None:
        """Roll every verified slot back to the state after its accepted tokens.

        Args:
            accept_num: ``[max_num_seqs]`` int32, tokens accepted per slot this step (the fed
                token and the accepted drafts; ``>= 1`` for a verified slot).
            verified: ``[max_num_seqs]`` bool, the slots whose item was a decode or verify
                item this step; other slots (prefill, idle) keep their state.
        """
        if not self.conv:
            return
        slots = paddle.nonzero(verified.astype("bool")).squeeze(1)
        if int(slots.shape[0]) == 0:
            return
        rows = paddle.clip(
            paddle.gather(accept_num.astype("int64"), slots) - 1, 0, self.max_rows - 1
        )
        picks = paddle.stack([slots, rows], axis=1)  # [n, 2]: (slot, snapshot row)
        # only the verified slots' rows are read and written (a gather and a scatter): a
        # select over every slot (take, where, assign) moved 4x the states and was 50x slower
        for states, snapshots in (
            (self.conv, self.conv_snapshots),
            (self.recurrent, self.recurrent_snapshots),
        ):
            for state, snaps in zip(states, snapshots):
                state.scatter_(slots, paddle.gather_nd(snaps, picks), overwrite=True)


#: What each state tensor of a linear layer holds, in :func:`state_specs` order.
STATE_KINDS = ("conv_state", "recurrent_state", "conv_snapshots", "recurrent_snapshots")


@dataclass(frozen=True)
class StateSpec:
    """One state tensor of one rank (named and shared like a KV cache: ``owner``, ``layer``,
    ``kind``, ``shape``, ``dtype``; ``layer`` counts the linear-attention layers only).
    Dimension 0 is the slot, not a block: these are never paged, cached or handed over."""

    owner: str
    layer: int
    kind: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor (float32, as every state is kept)."""
        return math.prod(self.shape) * 4


def verify_rows(spec: SpeculativeConfig) -> int:
    """Snapshot rows per slot: the most tokens one slot feeds in a verify pass, ``K + 1``
    (1 without speculation)."""
    return 1 + (spec.num_speculative_tokens if spec.enabled else 0)


def state_specs(
    config: ModelConfig, max_num_seqs: int, max_rows: int, tensor_parallel_size: int = 1
) -> list[StateSpec]:
    """The state tensors of one rank of ``config`` (none without linear-attention layers): per
    linear layer, :data:`STATE_KINDS` in order, for ``max_num_seqs`` slots and ``max_rows``
    (``K + 1``) snapshot rows; each rank holds ``1 / tensor_parallel_size`` of the heads and
    of the convolution's channels."""
    hybrid = config.hybrid
    if hybrid is None:
        return []
    conv, recurrent = hybrid.state_shapes(tensor_parallel_size)
    shapes = {
        "conv_state": (max_num_seqs, *conv),
        "recurrent_state": (max_num_seqs, *recurrent),
        "conv_snapshots": (max_num_seqs, max_rows, *conv),
        "recurrent_snapshots": (max_num_seqs, max_rows, *recurrent),
    }
    return [
        StateSpec("target", i, kind, shapes[kind])
        for i in range(hybrid.num_linear_layers)
        for kind in STATE_KINDS
    ]


def model_state_specs(model: object, fd_config: FDConfig) -> list[StateSpec]:
    """:func:`state_specs` of ``model`` (its ``config`` and ``tensor_parallel_size``) for
    ``fd_config``'s slots and ``K + 1`` rows (1 without speculation). Raises ``ValueError``
    for a model with linear layers under prefix caching: a cached block holds KV, not the
    recurrent state a hit would need."""
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig) or config.hybrid is None:
        return []
    if fd_config.cache_config.enable_prefix_caching:
        raise ValueError(
            "cache_config.enable_prefix_caching: the model has linear-attention layers, whose "
            "recurrent state a cached KV block cannot restore; turn prefix caching off"
        )
    tp = int(getattr(model, "tensor_parallel_size", 1))
    rows = verify_rows(fd_config.speculative_config)
    return state_specs(config, fd_config.scheduler_config.max_num_seqs, rows, tp)
