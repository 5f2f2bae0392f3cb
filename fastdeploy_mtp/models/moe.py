"""Mixture-of-experts MLP of DeepSeek-V3 / GLM-4.5 (:class:`MoEMLP`): a router picks
``num_experts_per_tok`` of ``n_routed_experts`` SwiGLU experts per token and weights them;
optional shared experts see every token.

Routing, in float32 whatever the model dtype (the checkpoints keep the router in float32):

1. ``logits = x @ gate.weight`` (``[T, E]``); ``scores = sigmoid(logits)`` or
   ``softmax(logits)`` (``config.scoring_func``).
2. The choice (``config.topk_method``):

   - ``"noaux_tc"`` (DeepSeek-V3, GLM-4.5): ``biased = scores + gate.e_score_correction_bias``;
     the ``E`` experts form ``n_group`` contiguous groups, a group's score is the sum of its two
     best biased scores, the ``topk_group`` best groups are kept and the top ``k`` biased
     scores among their experts are chosen;
   - ``"group_limited_greedy"`` (DeepSeek-V2): the same with a group's score its best
     (unbiased) score and the top ``k`` unbiased scores of the kept groups;
   - ``"greedy"``: the top ``k`` scores.

3. The weights are the UNbiased ``scores`` of the chosen experts; with ``norm_topk_prob`` they
   are divided by their sum (``+ 1e-20``; ERNIE-4.5, ``config.moe_norm_min > 0``: by
   ``max(sum, moe_norm_min)``); then multiplied by ``routed_scaling_factor``.

ERNIE-4.5 (:mod:`~fastdeploy_mtp.models.ernie_config`) is the ``noaux_tc`` rule with softmax
scores, one group (top ``k`` of ``softmax(logits) + e_score_correction_bias`` over all experts),
``norm_topk_prob``, ``moe_norm_min`` and no scaling (1.0); its correction bias is ``[1, E]``
(``config.moe_statics``).

``out = sum_j weight_j * expert_{idx_j}(x) + shared_experts(x)``.

Tensor parallelism: every expert (and the shared experts) is split along its intermediate
dimension like the dense MLP (gate/up column-parallel, down row-parallel), so each rank holds
every expert's slice; the router is replicated. The ranks' partial sums are all-reduced once,
after the combine. Expert parallelism is not implemented: every rank sees the same tokens, so
``empty_input_forward`` of the models stays a no-op.
"""

from __future__ import annotations

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .. import distributed
from .model_config import ModelConfig
from .parallel_layers import RowParallelLinear
from .swiglu import SwiGLUMLP


class _PartialRowLinear(RowParallelLinear):
    """:class:`RowParallelLinear` that returns this rank's partial product ``x_r @ W_r``
    ``[..., out]`` without the all-reduce (the MoE block sums once, after the combine)."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.matmul(x, self.weight)


class ExpertMLP(SwiGLUMLP):
    """One SwiGLU expert ``down_proj(silu(gate_proj(x)) * up_proj(x))``: gate/up ``[H, I/tp]``,
    down ``[I/tp, H]`` (this rank's slice). ``x [n, H]`` -> ``[n, H]``, this rank's partial
    sum (not reduced over the ranks)."""

    def __init__(self, hidden_size: int, intermediate_size: int, tensor_parallel_size: int = 1):
        super().__init__(hidden_size, intermediate_size, tensor_parallel_size, _PartialRowLinear)


class MoEGate(nn.Layer):
    """The router: ``weight [H, E]`` float32 (checkpoint ``mlp.gate.weight`` ``[E, H]``) and,
    for ``topk_method == "noaux_tc"``, ``e_score_correction_bias [E]`` float32 (``[1, E]`` with
    ``config.moe_statics``, ERNIE-4.5). Replicated."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        h, e = config.hidden_size, config.n_routed_experts
        self.weight = self.create_parameter([h, e], dtype="float32")
        self.e_score_correction_bias = None
        if config.topk_method == "noaux_tc":
            shape = [1, e] if config.moe_statics else [e]  # ERNIE-4.5 keeps it [1, E]
            self.e_score_correction_bias = self.create_parameter(
                shape, dtype="float32", default_initializer=nn.initializer.Constant(0.0)
            )
        self.top_k = config.num_experts_per_tok
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.scoring_func = config.scoring_func
        self.topk_method = config.topk_method
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = float(config.routed_scaling_factor)
        self.norm_min = float(config.moe_norm_min)

    def forward(self, x: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """``x [T, H]`` (any float dtype) -> ``(weights [T, k] float32, indices [T, k] int64)``;
        ``T >= 1``."""
        logits = paddle.matmul(x.astype("float32"), self.weight)
        scores = F.sigmoid(logits) if self.scoring_func == "sigmoid" else F.softmax(logits, axis=-1)
        choice = scores
        if self.e_score_correction_bias is not None:
            choice = scores + self.e_score_correction_bias
        if self.topk_method != "greedy":
            choice = self._keep_best_groups(choice)
        indices = paddle.topk(choice, k=self.top_k, axis=-1)[1]
        weights = paddle.take_along_axis(scores, indices, axis=-1)
        if self.norm_topk_prob:
            total = weights.sum(axis=-1, keepdim=True)
            weights = weights / (
                paddle.clip(total, min=self.norm_min) if self.norm_min > 0 else total + 1e-20
            )
        return weights * self.routed_scaling_factor, indices

    def _keep_best_groups(self, choice: paddle.Tensor) -> paddle.Tensor:
        """``choice [T, E]`` with the experts outside the ``topk_group`` best groups set to
        ``-inf`` (group score: sum of the best two for ``noaux_tc``, the best otherwise)."""
        t, e = choice.shape[0], choice.shape[1]
        grouped = choice.reshape([t, self.n_group, e // self.n_group])
        if self.topk_method == "noaux_tc":
            group_scores = paddle.topk(grouped, k=2, axis=-1)[0].sum(axis=-1)
        else:
            group_scores = grouped.max(axis=-1)
        best = paddle.topk(group_scores, k=self.topk_group, axis=-1)[1]
        keep = paddle.put_along_axis(paddle.zeros_like(group_scores), best, 1.0, axis=-1)
        keep = keep.unsqueeze(-1).expand([t, self.n_group, e // self.n_group]).reshape([t, e])
        return paddle.where(keep > 0, choice, paddle.full_like(choice, float("-inf")))


def check_moe_tensor_parallel(config: ModelConfig, tensor_parallel_size: int) -> None:
    """Raise ``ValueError`` when ``tensor_parallel_size`` does not divide an expert's
    intermediate size (``moe_intermediate_size``, and the shared experts'
    ``moe_intermediate_size * n_shared_experts``)."""
    if config.moe_intermediate_size % tensor_parallel_size != 0:
        raise ValueError(
            f"`moe_intermediate_size` ({config.moe_intermediate_size}) is not divisible by "
            f"`tensor_parallel_size` ({tensor_parallel_size}): each rank holds every expert's slice"
        )


class MoEMLP(nn.Layer):
    """DeepSeek-V3 / GLM-4.5 MoE block (see the module doc for the routing).

    Parameters (our names; checkpoint ``mlp.<name>``, matrices transposed there):
    ``gate.weight [H, E]`` float32, ``gate.e_score_correction_bias [E]`` float32
    (``noaux_tc`` only), ``experts.{e}.{gate,up}_proj.weight [H, I]``,
    ``experts.{e}.down_proj.weight [I, H]`` (``I = moe_intermediate_size``), and with
    ``n_shared_experts > 0`` ``shared_experts.{gate,up,down}_proj.weight`` of
    ``I * n_shared_experts``. Experts are in the model dtype; the routing weights are float32
    and the combine runs in float32.

    With ``tensor_parallel_size = tp`` every expert holds ``I/tp`` features (see the module
    doc); input and output are replicated.
    """

    def __init__(self, config: ModelConfig, tensor_parallel_size: int = 1):
        super().__init__()
        if config.n_routed_experts <= 0:
            raise ValueError("MoEMLP needs `n_routed_experts` > 0")
        if config.topk_method == "noaux_tc" and config.n_routed_experts // config.n_group < 2:
            raise ValueError(
                "`topk_method` 'noaux_tc' scores a group by its best two experts: "
                "`n_routed_experts / n_group` must be >= 2, got "
                f"{config.n_routed_experts // config.n_group}"
            )
        check_moe_tensor_parallel(config, tensor_parallel_size)
        h, inter, tp = config.hidden_size, config.moe_intermediate_size, tensor_parallel_size
        self.tensor_parallel_size = tp
        self.num_experts = config.n_routed_experts
        self.gate = MoEGate(config)
        self.experts = nn.LayerList(
            [ExpertMLP(h, inter, tp) for _ in range(config.n_routed_experts)]
        )
        self.shared_experts = (
            ExpertMLP(h, inter * config.n_shared_experts, tp) if config.n_shared_experts else None
        )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """Packed ``x [T, H]`` -> ``[T, H]`` in ``x``'s dtype (``T = 0`` gives ``[0, H]``)."""
        if x.shape[0] == 0:
            return paddle.zeros_like(x)
        weights, indices = self.gate(x)
        out = self._routed(x, weights, indices)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x).astype("float32")
        if self.tensor_parallel_size > 1:
            out = distributed.all_reduce_sum(out)
        return out.astype(x.dtype)

    def _routed(
        self, x: paddle.Tensor, weights: paddle.Tensor, indices: paddle.Tensor
    ) -> paddle.Tensor:
        """``sum_j weights[:, j] * expert_{indices[:, j]}(x)`` as float32 ``[T, H]``: each expert
        runs on the rows routed to it (gathered), its weighted output added back to them."""
        out = paddle.zeros([x.shape[0], x.shape[1]], dtype="float32")
        for e, expert in enumerate(self.experts):
            hit = (indices == e).astype("float32")  # [T, k]; an expert appears at most once per row
            rows = paddle.nonzero(hit.sum(axis=-1) > 0).reshape([-1])
            if rows.shape[0] == 0:
                continue
            row_weight = paddle.gather((weights * hit).sum(axis=-1), rows)
            y = expert(paddle.gather(x, rows)).astype("float32") * row_weight.unsqueeze(-1)
            out = paddle.index_add(out, rows, 0, y)
        return out

    def forward_dense(self, x: paddle.Tensor) -> paddle.Tensor:
        """Full sequences ``x [B, S, H]`` -> ``[B, S, H]`` (the tokens routed independently)."""
        b, s, h = x.shape
        return self.forward(x.reshape([b * s, h])).reshape([b, s, h])
