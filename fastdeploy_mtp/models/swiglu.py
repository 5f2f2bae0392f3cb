"""The SwiGLU MLP, ``down_proj(silu(gate_proj(x)) * up_proj(x))``, split over the
tensor-parallel ranks: the dense decoder blocks' MLP and, with a down projection that leaves
its partial sum unreduced, each MoE expert (:class:`~.moe.ExpertMLP`)."""

from __future__ import annotations

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .parallel_layers import ColumnParallelLinear, RowParallelLinear


class SwiGLUMLP(nn.Layer):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``; gate/up ``[H, I]``, down ``[I, H]``.
    With ``tensor_parallel_size = tp`` gate/up hold ``I/tp`` output features and ``down_proj``
    the matching ``I/tp`` input rows, its partial outputs summed over the ranks (``down``: the
    class of that row-parallel projection)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        tensor_parallel_size: int = 1,
        down: type[RowParallelLinear] = RowParallelLinear,
    ):
        super().__init__()
        tp = tensor_parallel_size
        self.gate_proj = ColumnParallelLinear(hidden_size, intermediate_size, tp)
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, tp)
        self.down_proj = down(intermediate_size, hidden_size, tp)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """``x [..., H]`` -> ``[..., H]``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def forward_dense(self, x: paddle.Tensor) -> paddle.Tensor:
        """Full sequences ``x [B, S, H]`` -> ``[B, S, H]`` (the same math as :meth:`forward`)."""
        return self.forward(x)
