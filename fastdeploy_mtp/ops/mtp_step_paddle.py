"""mtp_step_paddle: the draft's KV block allocator (v0 scheduler)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def mtp_step_paddle(
    base_model_stop_flags: "paddle.Tensor",
    stop_flags: "paddle.Tensor",
    batch_drop: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    block_tables: "paddle.Tensor",
    encoder_block_lens: "paddle.Tensor",
    used_list_len: "paddle.Tensor",
    free_list: "paddle.Tensor",
    free_list_len: "paddle.Tensor",
    block_size: int,
    max_draft_tokens: int,
) -> None:
    """Free and allocate the draft's KV blocks for the next round (legacy v0 scheduler).

    A sequential algorithm, identical on every backend (upstream's GPU kernel used atomics,
    so its free-list and allocation order varied between runs):

    1. **free**: items whose target stopped (``base_model_stop_flags``) or that were dropped
       (``batch_drop``) push their ``used_list_len[b]`` blocks
       ``block_tables[b, encoder_block_lens[b] + j]`` onto ``free_list`` (in order) and get
       ``used_list_len = encoder_block_lens = 0``, table slots -1;
    2. **need**: a running item needs a block when its table slot
       ``(seq_lens_decoder[b] + max_draft_tokens + 1) // block_size`` is -1;
    3. **evict**: while more items need a block than ``free_list_len``: the running item with
       the most used blocks (ties: smallest index) frees them and is stopped and dropped
       (``stop_flags = batch_drop = True``, ``seq_lens_this_time = seq_lens_decoder = 0``).
       The need count is not decremented by an eviction (as upstream). When no running item
       holds a block, eviction stops (upstream loops forever here);
    4. **alloc**: in batch order, each needing item that was not dropped pops the block at
       ``free_list[free_list_len - 1]``; an item for which no block is left is stopped and
       dropped instead — that is how the op reports items it cannot serve (``batch_drop``
       true while the target's stop flag is false).

    Args (``N`` items, ``B`` blocks per table, ``F`` free-list capacity):
        base_model_stop_flags: ``[N, 1]`` bool, in (target).
        stop_flags, batch_drop: ``[N, 1]`` bool, in/out.
        seq_lens_this_time, seq_lens_decoder: ``[N]`` int32, in/out (declared in place here;
            upstream writes them undeclared). seq_lens_encoder: ``[N]`` int32 (unused).
        block_tables: ``[N, B]`` int32, in/out, -1 = no block.
        encoder_block_lens, used_list_len: ``[N]`` int32, in/out.
        free_list: ``[F]`` int32, in/out (a stack). free_list_len: ``[1]`` int32, in/out.
        block_size: tokens per block (>= 1). max_draft_tokens: K (>= 0).

    Pushes past ``F`` and table slots past ``B`` are dropped, never written out of bounds.

    Raises:
        OpError: bad dtype/shape/batch size, ``block_size < 1`` or ``max_draft_tokens < 0``;
            nothing is modified.
    """
    run_paddle_op(
        "mtp_step_paddle",
        base_model_stop_flags, stop_flags, batch_drop, seq_lens_this_time, seq_lens_encoder,
        seq_lens_decoder, block_tables, encoder_block_lens, used_list_len, free_list,
        free_list_len, int(block_size), int(max_draft_tokens),
    )
