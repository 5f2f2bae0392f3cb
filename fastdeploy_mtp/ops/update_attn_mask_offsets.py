"""update_attn_mask_offsets: attention-mask window ends for the draft forward (multimodal)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def update_attn_mask_offsets(
    ids_remove_padding: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    cu_seqlens_q: "paddle.Tensor",
    attn_mask_offsets_full: "paddle.Tensor",
    is_block_step: "paddle.Tensor",
    decode_states: "paddle.Tensor",
) -> "paddle.Tensor":
    """Per-token attention-mask offsets, and the decode states of decode items
    (FastDeploy develop GPU signature, without ``attn_mask_offsets_decoder``/``mask_rollback``).

    Returns a new ``[2*T]`` int32 tensor (``attn_mask_offsets``; ``decode_states`` is
    updated in place), zero except the odd slot ``2*(q+i)+1`` of token
    ``i`` of each served item (``q = cu_seqlens_q[b]``). Item ``b`` is skipped when
    ``is_block_step[b]``, or when ``seq_lens_encoder[b] == seq_lens_decoder[b] == 0``.
    Otherwise, with ``slt, enc, dec`` its lengths:

    * prefill (``enc > 0``): ``dec + slt`` if ``decode_states[b, 0] == 2 and dec > 0``,
      else ``attn_mask_offsets_full[b, i] + 1``;
    * decode (``dec > 0``): ``dec + 1 + i``; and ``decode_states[b, i]`` becomes 0 for
      ``i < slt`` unless it is 1, and -1 for the 1s and the tail (every ``i < K+1``).

    Args:
        ids_remove_padding: ``[T]`` any dtype, in. Only its length ``T`` is used.
        seq_lens_this_time, seq_lens_encoder, seq_lens_decoder: ``[N]`` int32, in.
        cu_seqlens_q: ``[N+1]`` int32, in. First token of each item.
        attn_mask_offsets_full: ``[N, L]`` int32, in. Per-request mask offsets.
        is_block_step: ``[N]`` or ``[N, 1]`` bool, in.
        decode_states: ``[N, K+1]`` int32, **in/out** (``-1`` = unset).

    Slots past the output and reads past ``attn_mask_offsets_full``'s row are skipped. Any
    ``N`` (upstream: one block of 512 threads).

    Raises:
        OpError: a wrong dtype, rank, batch size or device; the message names the tensor.

    Example::

        i32 = lambda v: paddle.to_tensor(v, "int32")
        states = i32([[0, 0, -1]])
        out = update_attn_mask_offsets(paddle.zeros([2], "int64"), i32([2]), i32([0]), i32([9]),
                                       i32([0, 2]), paddle.zeros([1, 16], "int32"),
                                       paddle.zeros([1, 1], "bool"), states)
        # out == [0, 10, 0, 11]; states == [[0, 0, -1]]
    """
    # The Paddle op returns (attn_mask_offsets, decode_states_out); the second is
    # decode_states itself (in place), so only the new tensor is returned here.
    attn_mask_offsets, _ = run_paddle_op(
        "update_attn_mask_offsets",
        ids_remove_padding,
        seq_lens_this_time,
        seq_lens_encoder,
        seq_lens_decoder,
        cu_seqlens_q,
        attn_mask_offsets_full,
        is_block_step,
        decode_states,
    )
    return attn_mask_offsets
