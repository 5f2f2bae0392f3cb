"""The math of a Gated DeltaNet layer on one sequence, float32: the causal depthwise
convolution with its state, and the gated delta rule in its two forms, chunked (prefill) and
token by token (decode and verify, keeping the state after every token).

The rule, per value head, with ``S`` the ``[head_k_dim, head_v_dim]`` state and ``q_t, k_t``
L2-normalised (``q_t`` also scaled by ``head_k_dim ** -0.5``)::

    S = exp(g_t) * S
    S = S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t = S^T q_t

The chunked form computes the same outputs and final state over chunks of 64 tokens with
matrix products (the within-chunk updates condensed by one unit-lower-triangular solve), as
transformers' ``torch_chunk_gated_delta_rule`` does; the two agree to float32 rounding.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

#: Tokens per chunk of the chunked form (transformers' and FLA's default).
CHUNK_SIZE = 64


def causal_conv(
    x: paddle.Tensor, state: paddle.Tensor, weight: paddle.Tensor
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Depthwise causal convolution of one sequence, then SiLU.

    Args:
        x: ``[n, C]`` float32 inputs.
        state: ``[C, K - 1]`` float32, the ``K - 1`` inputs before ``x`` (zeros at the start).
        weight: ``[C, 1, K]`` (the checkpoint's ``conv1d.weight``).

    Returns:
        ``(out [n, C], window [K - 1 + n, C])``: ``out[t] = silu(sum_j w[:, j] *
        window[t + j])``; the state after token ``t`` is ``window[t + 1 : t + K]``
        (:func:`conv_state_after`).
    """
    kernel = int(weight.shape[-1])
    n = int(x.shape[0])
    window = paddle.concat([state.transpose([1, 0]), x], axis=0)
    w = weight.reshape([weight.shape[0], kernel]).astype("float32")
    out = window[0:n] * w[:, 0]
    for j in range(1, kernel):
        out = out + window[j : j + n] * w[:, j]
    return F.silu(out), window


def conv_state_after(window: paddle.Tensor, kernel: int, t: int) -> paddle.Tensor:
    """The ``[C, K - 1]`` convolution state after token ``t`` of :func:`causal_conv`'s window."""
    return window[t + 1 : t + kernel].transpose([1, 0])


def l2norm(x: paddle.Tensor, eps: float = 1e-6) -> paddle.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last axis (FLA's and transformers' form)."""
    return x * paddle.rsqrt((x * x).sum(axis=-1, keepdim=True) + eps)


def recurrent_rule(
    q: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
    g: paddle.Tensor,
    beta: paddle.Tensor,
    state: paddle.Tensor,
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The rule token by token.

    Args:
        q, k: ``[h, n, dk]`` float32 (normalised, ``q`` scaled); v: ``[h, n, dv]``.
        g, beta: ``[h, n]`` (log decay ``<= 0``, write strength in ``(0, 1)``).
        state: ``[h, dk, dv]``, the state before the first token.

    Returns:
        ``(out [h, n, dv], states [n, h, dk, dv])``, ``states[t]`` the state after token ``t``.
    """
    outs, states = [], []
    for t in range(int(q.shape[1])):
        state = state * paddle.exp(g[:, t]).reshape([-1, 1, 1])
        k_t = k[:, t].unsqueeze(-1)  # [h, dk, 1]
        read = (state * k_t).sum(axis=1)  # [h, dv]
        delta = (v[:, t] - read) * beta[:, t].unsqueeze(-1)
        state = state + k_t * delta.unsqueeze(1)
        outs.append((state * q[:, t].unsqueeze(-1)).sum(axis=1))
        states.append(state)
    return paddle.stack(outs, axis=1), paddle.stack(states, axis=0)


def _pad_rows(x: paddle.Tensor, pad: int) -> paddle.Tensor:
    """``x [h, n, ...]`` with ``pad`` zero rows appended along axis 1."""
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[1] = pad
    return paddle.concat([x, paddle.zeros(shape, dtype=x.dtype)], axis=1)


def chunked_rule(
    q: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
    g: paddle.Tensor,
    beta: paddle.Tensor,
    state: paddle.Tensor,
    chunk: int = CHUNK_SIZE,
) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The rule over chunks of ``chunk`` tokens; arguments as :func:`recurrent_rule`.

    Returns:
        ``(out [h, n, dv], final state [h, dk, dv])``.
    """
    h, n, dk = (int(d) for d in q.shape)
    dv = int(v.shape[-1])
    pad = (-n) % chunk
    m = (n + pad) // chunk
    q, k, v, g, beta = (_pad_rows(x, pad) for x in (q, k, v, g, beta))
    k_beta = (k * beta.unsqueeze(-1)).reshape([h, m, chunk, dk])
    v_beta = (v * beta.unsqueeze(-1)).reshape([h, m, chunk, dv])
    q, k = q.reshape([h, m, chunk, dk]), k.reshape([h, m, chunk, dk])
    cum = paddle.cumsum(g.reshape([h, m, chunk]), axis=-1)
    above = paddle.triu(paddle.ones([chunk, chunk], dtype="float32"), 1) > 0
    # decay[i, j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal
    gap = cum.unsqueeze(-1) - cum.unsqueeze(-2)
    decay = paddle.exp(paddle.where(above, paddle.full_like(gap, float("-inf")), gap))
    system = paddle.tril(paddle.matmul(k_beta, k, transpose_y=True) * decay, -1)
    system = system + paddle.eye(chunk, dtype="float32")
    intra = paddle.matmul(q, k, transpose_y=True) * decay
    new_values = paddle.linalg.triangular_solve(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = paddle.linalg.triangular_solve(
        system, k_beta * paddle.exp(cum).unsqueeze(-1), upper=False, unitriangular=True
    )
    q_decayed = q * paddle.exp(cum).unsqueeze(-1)
    k_decayed = k * paddle.exp(cum[..., -1:] - cum).unsqueeze(-1)
    chunk_decay = paddle.exp(cum[..., -1])  # [h, m]
    outs = []
    for i in range(m):
        v_new = new_values[:, i] - paddle.matmul(k_cumdecay[:, i], state)
        outs.append(paddle.matmul(q_decayed[:, i], state) + paddle.matmul(intra[:, i], v_new))
        state = state * chunk_decay[:, i].reshape([h, 1, 1]) + paddle.matmul(
            k_decayed[:, i], v_new, transpose_x=True
        )
    return paddle.concat(outs, axis=1)[:, :n], state
