"""eagle_gather_hidden_states: the last token's hidden state of each active item."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def eagle_gather_hidden_states(
    input: "paddle.Tensor",
    cu_seqlens_q: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    batch_id_per_token_output: "paddle.Tensor",
    cu_seqlens_q_output: "paddle.Tensor",
    real_output_token_num: "paddle.Tensor",
) -> Tuple["paddle.Tensor", "paddle.Tensor"]:
    """Gather one row per active item: the hidden state of its last token.

    Item ``b`` occupies ``seq_lens_this_time[b]`` consecutive rows of ``input`` (batch
    order). Row ``k`` of ``out`` is the last row of the ``k``-th item with
    ``seq_lens_this_time > 0``; rows past the number of active items are **zero**.

    Args:
        input: ``[T, H]`` float32, float16 or bfloat16, in. Any ``H`` (upstream asserts
            ``H % 4 == 0``).
        seq_lens_this_time: ``[N]`` (or ``[N, 1]``) int32, in.
        cu_seqlens_q, seq_lens_decoder, seq_lens_encoder, batch_id_per_token_output,
        cu_seqlens_q_output, real_output_token_num: not read (legacy inputs kept for
            FastDeploy's signature); must be on the same device.

    Returns:
        ``(out, output_token_num)``: ``out`` ``[N, H]`` of ``input``'s dtype,
        ``output_token_num`` ``[1]`` int32 = number of active items.

    Raises:
        OpError: a wrong dtype, rank, batch size or device; the message names the tensor.

    Example::

        hidden = paddle.arange(10, dtype="float32").reshape([5, 2])
        slt = paddle.to_tensor([2, 0, 3], "int32")
        z = paddle.zeros([3], "int32")
        out, n = eagle_gather_hidden_states(hidden, z, slt, z, z, z, z, z)
        # n == [2]; out rows: input row 1, input row 4, zeros
    """
    out, output_token_num = run_paddle_op(
        "eagle_gather_hidden_states",
        input,
        cu_seqlens_q,
        seq_lens_this_time,
        seq_lens_decoder,
        seq_lens_encoder,
        batch_id_per_token_output,
        cu_seqlens_q_output,
        real_output_token_num,
    )
    return out, output_token_num
