"""draft_model_postprocess: set the target's next token counts from its draft rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def draft_model_postprocess(
    base_model_draft_tokens: "paddle.Tensor",
    base_model_seq_lens_this_time: "paddle.Tensor",
    base_model_seq_lens_encoder: "paddle.Tensor",
    base_model_stop_flags: "paddle.Tensor",
) -> None:
    """Set ``seq_lens_this_time`` of each target item to the number of tokens it feeds next.

    Runs after the MTP substeps have written their drafts into the target's
    ``draft_tokens``. Per item ``b``:

    * stopped (``stop_flags[b]``): ``seq_lens_this_time[b] = 0``;
    * prefill (``seq_lens_encoder[b] != 0``, not stopped): unchanged;
    * decode: the number of entries of ``draft_tokens[b, :]`` that are not ``-1``, counted
      over the whole row. ``-1`` marks an empty slot wherever it stands: a hole in the
      middle of the row does not end the count (``[7, -1, 9]`` counts 2).

    Args:
        base_model_draft_tokens: ``[N, K+1]`` int64, in. Target draft rows
            ``[last accepted, d1..dK]``; ``-1`` is an empty slot.
        base_model_seq_lens_this_time: ``[N]`` (or ``[N, 1]``) int32, **in/out**.
        base_model_seq_lens_encoder: ``[N]`` (or ``[N, 1]``) int32, in. ``> 0`` in prefill.
        base_model_stop_flags: ``[N, 1]`` (or ``[N]``) bool, in.

    All four tensors must be on one device (CPU, or CUDA when built with CUDA) and
    contiguous; ``N`` is taken from ``base_model_seq_lens_this_time`` and every other
    tensor must agree. Any ``N`` works on every backend (upstream's GPU kernel is capped
    at 1024). Only ``base_model_seq_lens_this_time`` is written.

    Raises:
        OpError: a wrong dtype, rank, batch size or device; the message names the tensor,
            and no input has been modified.

    Example::

        draft = paddle.to_tensor([[5, 7, -1], [5, -1, 9], [1, 2, 3]], dtype="int64")
        slt = paddle.to_tensor([3, 3, 4], dtype="int32")
        enc = paddle.to_tensor([0, 0, 6], dtype="int32")
        stop = paddle.to_tensor([[False], [False], [False]])
        draft_model_postprocess(draft, slt, enc, stop)
        # slt == [2, 2, 4]: the third item is in prefill and keeps its count
    """
    run_paddle_op(
        "draft_model_postprocess",
        base_model_draft_tokens,
        base_model_seq_lens_this_time,
        base_model_seq_lens_encoder,
        base_model_stop_flags,
    )
