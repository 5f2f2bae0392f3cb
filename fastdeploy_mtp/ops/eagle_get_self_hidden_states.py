"""eagle_get_self_hidden_states: one hidden row per still-active item, for the next substep."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def eagle_get_self_hidden_states(
    input: "paddle.Tensor",
    last_seq_lens_this_time: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
) -> Tuple["paddle.Tensor", "paddle.Tensor"]:
    """Keep the hidden state of each still-active item's last token (develop GPU signature).

    Per item ``b``, with ``last = last_seq_lens_this_time[b]``:

    * ``seq_lens_encoder[b] > 0`` and ``seq_lens_this_time[b] > 0``: the item occupies one
      row of ``input``; it is kept;
    * ``seq_lens_this_time[b] > 0``: the item occupies ``last`` rows; row ``last - 1`` is
      kept;
    * otherwise nothing is kept; the item occupies ``min(last, 1)`` rows in prefill, else
      ``last``.

    Args:
        input: ``[T, H]`` float32, float16 or bfloat16, in. The substep's hidden states.
        last_seq_lens_this_time: ``[N]`` int32, in. Draft ``seq_lens_this_time`` before the
            substep (a clone taken before ``draft_model_update``).
        seq_lens_this_time: ``[N]`` int32, in. Draft ``seq_lens_this_time`` after it (0 or 1).
        seq_lens_encoder: ``[N]`` int32, in.

    Returns:
        ``(out, output_token_num)``: ``out`` ``[T, H]``, kept rows compacted in batch order,
        rows past ``output_token_num`` zero; ``output_token_num`` ``[1]`` int32.

    A decode item with ``last == 0`` but ``seq_lens_this_time > 0`` has no row to keep: its
    output row is zero. Negative lengths count as 0. Any ``H``, any ``N``.

    Raises:
        OpError: a wrong dtype, rank, batch size or device; the message names the tensor.

    Example::

        hidden = paddle.arange(10, dtype="float32").reshape([5, 2])
        last = paddle.to_tensor([3, 2], "int32"); slt = paddle.to_tensor([1, 1], "int32")
        enc = paddle.to_tensor([0, 0], "int32")
        out, n = eagle_get_self_hidden_states(hidden, last, slt, enc)
        # n == [2]; out rows: input row 2, input row 4, then zeros
    """
    out, output_token_num = run_paddle_op(
        "eagle_get_self_hidden_states", input, last_seq_lens_this_time, seq_lens_this_time, seq_lens_encoder
    )
    return out, output_token_num
