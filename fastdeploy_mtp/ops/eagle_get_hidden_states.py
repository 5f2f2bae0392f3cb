"""eagle_get_hidden_states: pick the target hidden rows the MTP layer consumes this round."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def eagle_get_hidden_states(
    input: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    stop_flags: "paddle.Tensor",
    accept_nums: "paddle.Tensor",
    base_model_seq_lens_this_time: "paddle.Tensor",
    base_model_seq_lens_encoder: "paddle.Tensor",
    actual_draft_token_num: int,
) -> Tuple["paddle.Tensor", "paddle.Tensor"]:
    """Select, per item, the target hidden rows that pair with the MTP's input tokens.

    FastDeploy develop GPU layout: items in batch order, each item's rows contiguous. Per
    item ``b`` (counts use the *draft's* ``seq_lens_encoder``):

    * draft prefill (``seq_lens_encoder[b] > 0``): all ``seq_lens_encoder[b]`` of its target
      rows;
    * draft ``seq_lens_this_time[b] == 0``: none (its ``base_model_seq_lens_this_time[b]``
      target rows are skipped);
    * decode: its **first** ``accept_nums[b]`` target rows (the accepted tokens).

    Args:
        input: ``[T, H]`` float32, float16 or bfloat16, in. The target's full hidden states;
            item ``b`` owns ``base_model_seq_lens_this_time[b]`` consecutive rows (prefill
            items ``seq_lens_encoder[b]``). Any ``H``.
        seq_lens_this_time: ``[N]`` (or ``[N, 1]``) int32, in. Draft tokens this round.
        seq_lens_encoder: ``[N]`` int32, in. Draft prefill length (``> 0`` in prefill).
        seq_lens_decoder, stop_flags, base_model_seq_lens_encoder: not read (kept for
            FastDeploy's signature); must be on the same device.
        accept_nums: ``[N]`` int32, in. Tokens the target accepted.
        base_model_seq_lens_this_time: ``[N]`` int32, in. Target rows per item.
        actual_draft_token_num: int attr, not read (FastDeploy passes ``num_model_steps``).

    Returns:
        ``(out, output_token_num)``: ``out`` ``[T, H]`` of ``input``'s dtype, the selected
        rows first; rows past ``output_token_num`` are **zero** (upstream leaves them
        uninitialised). ``output_token_num`` ``[1]`` int32 on ``input``'s device, the
        number of selected rows (not synchronised to the host).

    Deviations (docs/compat.md): rows that would be garbage upstream are zero — the tail,
    and decode rows with no target row behind them (``base_model_seq_lens_this_time == 0``,
    or ``accept_nums`` larger than it); negative lengths count as 0; any ``H`` and any
    ``N`` (no cooperative launch, no divisibility assert).

    Raises:
        OpError: a wrong dtype, rank, batch size or device; the message names the tensor.

    Example::

        hidden = paddle.arange(12, dtype="float32").reshape([6, 2])   # rows 0..5
        slt = paddle.to_tensor([3, 1], "int32"); enc = paddle.to_tensor([0, 0], "int32")
        acc = paddle.to_tensor([2, 1], "int32"); base = paddle.to_tensor([3, 3], "int32")
        zeros = paddle.zeros([2], "int32")
        out, n = eagle_get_hidden_states(hidden, slt, enc, zeros, zeros, acc, base, zeros, 1)
        # n == [3]; out rows: input rows 0, 1 (item 0's first 2), 3 (item 1's first), 0, 0, 0
    """
    out, output_token_num = run_paddle_op(
        "eagle_get_hidden_states",
        input,
        seq_lens_this_time,
        seq_lens_encoder,
        seq_lens_decoder,
        stop_flags,
        accept_nums,
        base_model_seq_lens_this_time,
        base_model_seq_lens_encoder,
        int(actual_draft_token_num),
    )
    return out, output_token_num
