"""speculate_get_logits: lay out draft logits rows per item into the target's draft_logits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def speculate_get_logits(
    draft_logits: "paddle.Tensor",
    next_token_num: "paddle.Tensor",
    batch_token_num: "paddle.Tensor",
    cu_next_token_offset: "paddle.Tensor",
    cu_batch_token_offset: "paddle.Tensor",
    logits: "paddle.Tensor",
    first_token_logits: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
) -> None:
    """Copy each item's logits rows into ``draft_logits`` and write the row counts/offsets.

    Per item ``b`` (prefill: ``seq_lens_encoder[b] > 0``):

    * ``next_token_num[b]`` = 1 in prefill, else ``seq_lens_this_time[b]`` (rows of ``logits``);
    * ``batch_token_num[b]`` = 2 in prefill, else ``seq_lens_this_time[b]`` (rows of
      ``draft_logits``);
    * ``cu_next_token_offset[b+1]`` / ``cu_batch_token_offset[b+1]``: **inclusive** prefix
      sums of those counts (FastDeploy's GPU convention). Element ``[0]`` is never written
      and is taken as 0.
    * With ``n = cu_next_token_offset[b]`` and ``d = cu_batch_token_offset[b]``: prefill
      copies ``first_token_logits[b]`` to row ``d`` and ``logits[n]`` to row ``d+1``; decode
      copies ``logits[n+j]`` to row ``d+j`` for ``j < seq_lens_this_time[b]``.

    Args:
        draft_logits: ``[R, V]`` float32 (or float16 / bfloat16), **in/out**. Other rows keep
            their values.
        next_token_num, batch_token_num: ``[N]`` int32, **out**.
        cu_next_token_offset, cu_batch_token_offset: ``[N+1]`` int32, **out** (``[1..N]``).
        logits: ``[rows, V]`` same dtype, in. The draft's logits rows, items in batch order.
        first_token_logits: ``[N, V]`` same dtype, in.
        seq_lens_this_time, seq_lens_encoder: ``[N]`` int32, in.

    Copies whose source or destination row falls outside its tensor are skipped (upstream
    reads and writes out of bounds). Negative ``seq_lens_this_time`` counts as 0. No
    per-call device allocation and no host sync (upstream mallocs and frees CUB scratch
    every call). ``next_token_num`` and ``cu_next_token_offset``, which upstream writes
    without declaring, are declared in-place outputs here (``next_token_num_out``,
    ``cu_next_token_offset_out``, after FastDeploy's three outputs).

    Raises:
        OpError: a wrong dtype, rank, batch size, vocab size or device; the message names
            the tensor, and no input has been modified.

    Example::

        draft = paddle.zeros([4, 3]); logits = paddle.ones([3, 3]); first = paddle.full([2, 3], 7.0)
        i32 = lambda v: paddle.to_tensor(v, "int32")
        nxt, bat = i32([0, 0]), i32([0, 0]); cun, cub = i32([0, 0, 0]), i32([0, 0, 0])
        speculate_get_logits(draft, nxt, bat, cun, cub, logits, first, i32([2, 5]), i32([0, 5]))
        # bat == [2, 2], cub == [0, 2, 4]; draft rows 0-1 = logits rows 0-1, row 2 = first[1],
        # row 3 = logits row 2
    """
    run_paddle_op(
        "speculate_get_logits",
        draft_logits,
        next_token_num,
        batch_token_num,
        cu_next_token_offset,
        cu_batch_token_offset,
        logits,
        first_token_logits,
        seq_lens_this_time,
        seq_lens_encoder,
    )
