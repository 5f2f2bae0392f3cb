"""Dense causal attention over full sequences: the training path of the same attention
modules the paged backend (:mod:`.attention`) serves with, and the additive causal mask it
takes."""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F


def repeat_kv(x: paddle.Tensor, groups: int, axis: int) -> paddle.Tensor:
    """Repeat each key/value head ``groups`` times along ``axis`` (GQA -> MHA layout)."""
    if groups == 1:
        return x
    return paddle.repeat_interleave(x, groups, axis=axis)


def causal_bias(seq_len: int) -> paddle.Tensor:
    """``[seq_len, seq_len]`` float32 additive mask: 0 on and below the diagonal, -inf above.
    Build it once per sequence length (``paddle.triu`` per step is slow on CPU)."""
    upper = np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)
    return paddle.to_tensor(np.where(upper, -np.inf, 0.0).astype(np.float32))


def dense_causal_attention(
    q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor | None, scale: float
) -> paddle.Tensor:
    """Causal (or otherwise masked) attention over full sequences (training path).

    Args:
        q: ``[B, num_heads, S, head_dim]``.
        k, v: ``[B, num_kv_heads, S', head_dim]`` (``S' = S`` for self-attention).
        bias: ``[S, S']`` additive mask, e.g. :func:`causal_bias` (or a larger one; it is
            sliced to ``[S, S']``).
        scale: usually ``1/sqrt(head_dim)``.

    Returns:
        ``[B, S, num_heads * head_dim]``.
    """
    bsz, nh, seq, hd = q.shape
    keys = int(k.shape[2])
    groups = nh // int(k.shape[1])
    k = repeat_kv(k, groups, axis=1)
    v = repeat_kv(v, groups, axis=1)
    scores = paddle.matmul(q, k, transpose_y=True) * scale
    if bias is not None:
        scores = scores + bias[:seq, :keys]
    probs = F.softmax(scores, axis=-1)
    out = paddle.matmul(probs, v)  # [B, nh, S, hd]
    return out.transpose([0, 2, 1, 3]).reshape([bsz, seq, nh * hd])
