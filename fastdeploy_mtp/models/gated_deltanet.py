"""The Gated DeltaNet linear-attention layer of Qwen3-Next and Qwen3.5 on a packed batch,
reading and writing its per-slot states in ``ForwardMeta.linear_states``
(:mod:`~fastdeploy_mtp.models.linear_state` says what each kind of batch item does with them).

``x [T, H]`` -> projections -> queries, keys and values through a causal depthwise convolution
with SiLU -> L2-normalised queries and keys -> ``beta = sigmoid(b)``, ``g = -exp(A_log) *
softplus(a + dt_bias)`` -> the gated delta rule (:mod:`~fastdeploy_mtp.models.delta_rule`;
chunked for a prefill item, token by token for a decode/verify item) -> ``norm(core, z)``
(RMSNorm over each value head, then ``* silu(z)``) -> ``out_proj``.

Projections, as the checkpoints have them: Qwen3-Next's ``in_proj_qkvz`` (per key head ``h``:
its query, its key, its ``r = value_heads / key_heads`` value heads, their ``z``) and
``in_proj_ba`` (per key head: ``r`` values of ``b``, then ``r`` of ``a``); Qwen3.5's
``in_proj_qkv`` (all queries, all keys, all values), ``in_proj_z``, ``in_proj_b``,
``in_proj_a``. The convolution's channels are queries, keys, values in that order.

Tensor parallelism splits the heads: rank ``r`` holds key heads ``r * nk/tp ..`` and their value
heads. Qwen3-Next's grouped projections split contiguously; Qwen3.5's ``in_proj_qkv`` and the
convolution split each of their query, key and value parts (the weight map's ``parts``);
``out_proj`` is row-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .delta_rule import causal_conv, chunked_rule, conv_state_after, l2norm, recurrent_rule
from .forward_meta import ForwardMeta
from .linear_state import LinearStates
from .model_config import ModelConfig
from .parallel_layers import ColumnParallelLinear, RowParallelLinear


class DepthwiseConv(nn.Layer):
    """The convolution's ``weight [C/tp, 1, K]`` (checkpoint ``conv1d.weight``), no bias."""

    shard_axes = {"weight": 0}

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = self.create_parameter([channels, 1, kernel], dtype=paddle.get_default_dtype())


class GatedRMSNorm(nn.Layer):
    """``weight * x / sqrt(mean(x^2) + eps) * silu(gate)`` over each value head
    (``weight [head_v_dim]``, replicated); statistics and gate in float32."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter(
            [size],
            dtype=paddle.get_default_dtype(),
            default_initializer=nn.initializer.Constant(1.0),
        )

    def forward(self, x: paddle.Tensor, gate: paddle.Tensor) -> paddle.Tensor:
        x32 = x.astype("float32")
        normed = x32 * paddle.rsqrt(paddle.mean(x32 * x32, axis=-1, keepdim=True) + self.eps)
        out = (self.weight * normed.astype(self.weight.dtype)).astype("float32")
        return (out * F.silu(gate.astype("float32"))).astype(self.weight.dtype)


@dataclass(frozen=True)
class LinearItem:
    """One batch item with tokens: slot ``slot``, rows ``start .. start + n - 1``,
    ``prefill`` (``seq_lens_encoder > 0``), ``fresh`` (``seq_lens_decoder == 0``)."""

    slot: int
    start: int
    n: int
    prefill: bool
    fresh: bool


def linear_items(meta: ForwardMeta) -> list[LinearItem]:
    """The items of ``meta`` that feed tokens, read back to the host once per forward (shared
    by every linear layer through the plan's memo)."""

    def build() -> list[LinearItem]:
        this_time = np.asarray(meta.seq_lens_this_time.numpy()).reshape(-1)
        encoder = np.asarray(meta.seq_lens_encoder.numpy()).reshape(-1)
        decoder = np.asarray(meta.seq_lens_decoder.numpy()).reshape(-1)
        starts = np.concatenate([[0], np.cumsum(this_time)])
        return [
            LinearItem(b, int(starts[b]), int(n), bool(encoder[b] > 0), bool(decoder[b] == 0))
            for b, n in enumerate(this_time)
            if n > 0
        ]

    return meta.plan().memo("linear_items", build)


class GatedDeltaNet(nn.Layer):
    """One Gated DeltaNet layer (see the module doc); ``config.hybrid`` gives its shape."""

    def __init__(self, config: ModelConfig, tensor_parallel_size: int = 1):
        super().__init__()
        spec = config.hybrid
        if spec is None:
            raise ValueError("GatedDeltaNet needs a hybrid config (`config.hybrid`)")
        tp = tensor_parallel_size
        spec.check_tensor_parallel(tp)
        self.nk, self.nv = spec.linear_num_key_heads // tp, spec.linear_num_value_heads // tp
        self.dk, self.dv = spec.linear_key_head_dim, spec.linear_value_head_dim
        self.kernel = spec.linear_conv_kernel_dim
        self.fused = spec.fused_projections
        h, key_dim, value_dim = config.hidden_size, spec.key_dim, spec.value_dim
        heads = spec.linear_num_value_heads
        if self.fused:
            self.in_proj_qkvz = ColumnParallelLinear(h, 2 * key_dim + 2 * value_dim, tp)
            self.in_proj_ba = ColumnParallelLinear(h, 2 * heads, tp)
        else:
            self.in_proj_qkv = ColumnParallelLinear(h, spec.conv_dim, tp)
            self.in_proj_z = ColumnParallelLinear(h, value_dim, tp)
            self.in_proj_b = ColumnParallelLinear(h, heads, tp)
            self.in_proj_a = ColumnParallelLinear(h, heads, tp)
        self.conv1d = DepthwiseConv(spec.conv_dim // tp, self.kernel)
        self.dt_bias = self.create_parameter([self.nv], dtype=paddle.get_default_dtype())
        self.A_log = self.create_parameter([self.nv], dtype=paddle.get_default_dtype())
        self.shard_axes = {"dt_bias": 0, "A_log": 0}
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = RowParallelLinear(value_dim, h, tp)

    def _project(
        self, x: paddle.Tensor
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """``x [T, H]`` -> ``(qkv [T, C] in convolution order, z [T, nv, dv], b [T, nv],
        a [T, nv])`` for this rank's heads."""
        t, r = int(x.shape[0]), self.nv // self.nk
        if not self.fused:
            z = self.in_proj_z(x).reshape([t, self.nv, self.dv])
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        grouped = self.in_proj_qkvz(x).reshape([t, self.nk, 2 * self.dk + 2 * r * self.dv])
        q, k, v, z = paddle.split(grouped, [self.dk, self.dk, r * self.dv, r * self.dv], axis=-1)
        qkv = paddle.concat([q.reshape([t, -1]), k.reshape([t, -1]), v.reshape([t, -1])], axis=-1)
        ba = self.in_proj_ba(x).reshape([t, self.nk, 2 * r])
        b, a = ba[..., :r].reshape([t, self.nv]), ba[..., r:].reshape([t, self.nv])
        return qkv, z.reshape([t, self.nv, self.dv]), b, a

    def forward(self, x: paddle.Tensor, meta: ForwardMeta, layer_id: int) -> paddle.Tensor:
        """Packed ``x [T, H]`` -> ``[T, H]``; ``layer_id`` is this layer's entry in
        ``meta.linear_states`` (written in place). Padding rows give zeros before
        ``out_proj``."""
        states = meta.linear_states
        if states is None:
            raise ValueError("`forward_meta.linear_states` is required by a linear-attention layer")
        qkv, z, b, a = self._project(x)
        beta = F.sigmoid(b.astype("float32"))
        g = -paddle.exp(self.A_log.astype("float32")) * F.softplus(
            a.astype("float32") + self.dt_bias.astype("float32")
        )
        outs, used = [], 0
        for item in linear_items(meta):
            rows = slice(item.start, item.start + item.n)
            outs.append(self._item(qkv[rows], g[rows], beta[rows], states, layer_id, item))
            used = item.start + item.n
        t = int(x.shape[0])
        if used < t:
            outs.append(paddle.zeros([t - used, self.nv, self.dv], dtype="float32"))
        core = paddle.concat(outs, axis=0)
        return self.out_proj(self.norm(core, z).reshape([t, self.nv * self.dv]))

    def _item(
        self,
        qkv: paddle.Tensor,
        g: paddle.Tensor,
        beta: paddle.Tensor,
        states: LinearStates,
        li: int,
        item: LinearItem,
    ) -> paddle.Tensor:
        """One item's ``[n, nv, dv]`` core output; its states written (module doc)."""
        n, slot, r = item.n, item.slot, self.nv // self.nk
        conv0, rec0 = states.conv[li][slot], states.recurrent[li][slot]
        if item.fresh:
            conv0, rec0 = paddle.zeros_like(conv0), paddle.zeros_like(rec0)
        mixed, window = causal_conv(qkv.astype("float32"), conv0, self.conv1d.weight)
        kd = self.nk * self.dk
        q, k, v = paddle.split(mixed, [kd, kd, self.nv * self.dv], axis=-1)

        def heads(x: paddle.Tensor, count: int, width: int) -> paddle.Tensor:
            x = x.reshape([n, count, width])
            return (x.repeat_interleave(r, axis=1) if count != self.nv else x).transpose([1, 0, 2])

        q = l2norm(heads(q, self.nk, self.dk)) * (self.dk**-0.5)
        k = l2norm(heads(k, self.nk, self.dk))
        v = heads(v, self.nv, self.dv)
        g, beta = g.transpose([1, 0]), beta.transpose([1, 0])
        if item.prefill:
            out, final = chunked_rule(q, k, v, g, beta, rec0)
            states.conv[li][slot] = conv_state_after(window, self.kernel, n - 1)
            states.recurrent[li][slot] = final
            return out.transpose([1, 0, 2])
        if n > states.max_rows:
            raise ValueError(
                f"slot {slot} feeds {n} tokens in a decode/verify step but the linear states "
                f"keep {states.max_rows} snapshots (`max_rows`)"
            )
        out, after = recurrent_rule(q, k, v, g, beta, rec0)
        convs = paddle.stack([conv_state_after(window, self.kernel, j) for j in range(n)])
        states.conv_snapshots[li][slot, :n] = convs
        states.recurrent_snapshots[li][slot, :n] = after
        states.conv[li][slot] = convs[n - 1]
        states.recurrent[li][slot] = after[n - 1]
        return out.transpose([1, 0, 2])
