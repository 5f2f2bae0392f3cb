"""Training path of MTP layers unrolled for several substeps, attending exactly as the
proposer's substeps do at serving time.

At serving time (:class:`~fastdeploy_mtp.proposer.MTPProposer`) substep 1 of a round feeds
the MTP layer the accepted tokens with the target's hidden states; substep ``k >= 2`` feeds
one row: the draft of substep ``k - 1`` with the MTP layer's own output hidden state. The
row of substep ``k`` sits ``k - 1`` positions past the last accepted row and attends to

* the depth-1 rows (token + *target* hidden state) at every position up to the last
  accepted one, and
* the rows of substeps ``2 .. k`` of this round (the chain of drafts), one per position.

:func:`unrolled_mtp_forward` reproduces that over full training sequences: for every
position ``p`` and depth ``k`` it computes the row a substep-``k`` draft at ``p`` would
compute if the drafts before it had been the sequence's own tokens, with an attention
mask (:func:`depth_bias`) that lets the depth-``k`` query at ``p`` see depth-1 keys at
positions ``<= p - k + 1`` and the depth-``j`` key at ``p - k + j`` for ``2 <= j <= k``.

With several distinct MTP layers (``num_nextn_predict_layers`` > 1) substep ``k`` runs layer
``(k - 1) % L``; each layer keeps its own KV cache, and the proposer refills it so that the
layer sees the same pattern under its own weights (depth-1 rows of the accepted prefix and
the chain rows of this round, recomputed with this layer). The training path therefore
computes, for depth ``k``, keys and values of every depth ``j <= k`` with the weights of the
layer that runs depth ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import paddle

from .layers import DenseStep
from .mtp_layer import MTPLayer

#: Additive mask value for a key a query must not see.
_MASKED = -1e9


def depth_bias(num_rows: int, depth: int) -> paddle.Tensor:
    """``[num_rows, depth * num_rows]`` float32 additive mask of the depth-``depth`` queries
    over the keys of depths ``1 .. depth`` laid out depth after depth.

    Query row ``p`` may see depth-1 key ``c`` iff ``c <= p - depth + 1`` and depth-``j`` key
    ``c`` (``j >= 2``) iff ``c == p - depth + j``. Rows ``p < depth - 1`` have no valid chain
    (a draft at depth ``depth`` needs ``depth - 1`` earlier positions); they also see depth-1
    key 0, so their softmax stays finite, and callers leave them out of the loss.
    """
    if num_rows <= 0 or depth <= 0:
        raise ValueError(f"`num_rows` and `depth` must be positive, got {num_rows}, {depth}")
    p = np.arange(num_rows)[:, None]
    c = np.arange(num_rows)[None, :]
    blocks = [c <= np.maximum(p - depth + 1, 0)]
    blocks += [c == p - depth + j for j in range(2, depth + 1)]
    allowed = np.concatenate(blocks, axis=1)
    return paddle.to_tensor(np.where(allowed, 0.0, _MASKED).astype(np.float32))


def unrolled_mtp_forward(
    layers: Sequence[MTPLayer], next_ids: paddle.Tensor, target_hidden: paddle.Tensor, depth: int
) -> list[paddle.Tensor]:
    """Run ``depth`` MTP substeps over full sequences.

    Args:
        layers: the distinct MTP layers; depth ``k`` runs ``layers[(k - 1) % len(layers)]``.
        next_ids: ``[B, S]`` int64, row ``p`` holds token ``t_{p+1}``.
        target_hidden: ``[B, S, H]`` float32, row ``p`` holds the target's hidden state ``h_p``.
        depth: substeps to unroll (>= 1).

    Returns:
        ``depth`` tensors ``[B, S, H]``: entry ``k - 1`` row ``p`` is the depth-``k`` output
        at position ``p``, which predicts ``t_{p+2}``. It is meaningful for ``p >= k - 1``.
        Depth 1 equals :meth:`MTPLayer.forward_dense`.
    """
    if depth < 1 or not layers:
        raise ValueError(
            f"need depth >= 1 and at least one layer, got depth {depth}, {len(layers)} layers"
        )
    s = int(next_ids.shape[1])
    first = layers[0]
    cos, sin = first.rotary.prefix(s)
    emb = first.embed_dense(next_ids)
    hidden_in = [target_hidden.astype("float32")]  # hidden input of depth j at index j - 1
    rows: dict[tuple[int, int], tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]] = {}
    outs: list[paddle.Tensor] = []
    for k in range(1, depth + 1):
        li = (k - 1) % len(layers)
        layer = layers[li]
        if k > 1:
            prev = outs[-1]
            hidden_in.append(paddle.concat([paddle.zeros_like(prev[:, :1]), prev[:, :-1]], axis=1))
        keys, values = [], []
        for j in range(1, k + 1):
            if (li, j) not in rows:
                x = layer._fuse(emb, hidden_in[j - 1])
                rows[(li, j)] = (x, *layer.mtp_block.dense_kv(x, cos, sin))
            keys.append(rows[(li, j)][1])
            values.append(rows[(li, j)][2])
        x = rows[(li, k)][0]
        kv = (paddle.concat(keys, axis=2), paddle.concat(values, axis=2))
        outs.append(
            layer.finish(
                layer.mtp_block.forward_dense(x, DenseStep(cos, sin, depth_bias(s, k)), kv)
            )
        )
    return outs
