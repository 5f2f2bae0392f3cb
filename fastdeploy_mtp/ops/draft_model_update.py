"""draft_model_update: advance the draft state after one MTP substep."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def draft_model_update(
    inter_next_tokens: "paddle.Tensor",
    draft_tokens: "paddle.Tensor",
    pre_ids: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    step_idx: "paddle.Tensor",
    cu_seqlens_q_output: "paddle.Tensor",
    stop_flags: "paddle.Tensor",
    not_need_stop: "paddle.Tensor",
    max_dec_len: "paddle.Tensor",
    end_ids: "paddle.Tensor",
    base_model_draft_tokens: "paddle.Tensor",
    max_seq_len: int,
    substep: int,
) -> None:
    """Record the token sampled at MTP substep ``substep`` and advance the draft state.

    FastDeploy ``develop`` semantics. ``inter_next_tokens`` is compacted: entry ``k`` belongs
    to the ``k``-th item (in batch order) whose **input** ``seq_lens_this_time`` is > 0. Only
    those items are touched (``tok`` = their token):

    * stopped: ``draft_tokens[b, 0] = -1``, ``base_model_draft_tokens[b, substep + 1] = -1``;
    * just prefilled (``seq_lens_encoder[b] > 0``): ``seq_lens_decoder += seq_lens_encoder``,
      ``seq_lens_encoder = 0``, ``pre_ids[b, 1] = tok`` (index 1 always, as upstream — wrong
      for a resumed request, kept for compatibility), ``step_idx += 1``,
      ``draft_tokens[b, 0] = tok``, and the base slot gets ``tok`` if the *incremented*
      ``step_idx < max_dec_len[b]``;
    * decode (``seq_lens_decoder[b] > 0``): if ``step_idx >= max_dec_len - 1`` the base slot
      gets -1 and nothing advances; else ``seq_lens_decoder += slt``, ``step_idx += slt``,
      ``pre_ids[b, step_idx] = tok``, ``draft_tokens[b, 0] = tok``, base slot = ``tok``;
    * then ``seq_lens_this_time = 0 if stopped else 1`` (and ``seq_lens_encoder = 0`` if
      stopped).

    ``not_need_stop[0]`` = (number of stopped items with ``slt > 0``) < ``bsz``. There is no
    EOS check (develop): ``end_ids`` and ``cu_seqlens_q_output`` are accepted for
    compatibility and not read, and neither is ``max_seq_len``.

    Args (``N`` items, ``W = K + 1``, ``L`` = max_model_len):
        inter_next_tokens: int64, one token per active item (any shape; read flat). A
            missing entry reads as -1.
        draft_tokens: ``[N, W]`` int64, in/out. pre_ids: ``[N, L]`` int64, in/out.
        seq_lens_this_time, seq_lens_encoder, seq_lens_decoder: ``[N]`` int32, in/out.
        step_idx: ``[N, 1]`` int64, in/out. cu_seqlens_q_output: int32, >= N + 1 elements.
        stop_flags: ``[N, 1]`` bool, in/out (declared in place; not written in develop).
        not_need_stop: ``[1]`` bool, out. max_dec_len: ``[N, 1]`` int64. end_ids: ``[E, 1]`` int64.
        base_model_draft_tokens: ``[N, W]`` int64, in/out (the target's draft rows).
        max_seq_len: ``max_model_len`` (>= 0, unused). substep: ``0 <= substep < W - 1``.

    Deviation from upstream (pinned by a test): the compacted index is computed from the
    input ``seq_lens_this_time``, never from values the op is overwriting; any ``N`` works
    (upstream's GPU kernel ignores items past 512).

    Raises:
        OpError: bad dtype/rank/batch size, widths that disagree, ``substep`` out of range;
            nothing is modified.
    """
    run_paddle_op(
        "draft_model_update",
        inter_next_tokens, draft_tokens, pre_ids, seq_lens_this_time, seq_lens_encoder,
        seq_lens_decoder, step_idx, cu_seqlens_q_output, stop_flags, not_need_stop,
        max_dec_len, end_ids, base_model_draft_tokens, int(max_seq_len), int(substep),
    )
