"""draft_model_preprocess: build the draft's shadow state from the target's verified state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def draft_model_preprocess(
    draft_tokens: "paddle.Tensor",
    input_ids: "paddle.Tensor",
    stop_flags: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    step_idx: "paddle.Tensor",
    not_need_stop: "paddle.Tensor",
    pre_ids: "paddle.Tensor",
    accept_tokens: "paddle.Tensor",
    accept_num: "paddle.Tensor",
    target_model_seq_lens_encoder: "paddle.Tensor",
    target_model_seq_lens_decoder: "paddle.Tensor",
    target_model_step_idx: "paddle.Tensor",
    target_model_stop_flags: "paddle.Tensor",
    max_dec_len: "paddle.Tensor",
    target_model_draft_tokens: "paddle.Tensor",
    num_model_step: int,
    is_splitwise_prefill: bool,
) -> None:
    """Start an MTP round: set the draft's state from the target's state after verification.

    FastDeploy ``develop`` semantics (17 inputs). Per item ``b`` (``bsz`` = len of
    ``seq_lens_this_time``), with ``tgt = target_model_step_idx[b]``:

    * always: ``target_model_draft_tokens[b, 1:] = -1`` (the drafts of this round are written
      again by :func:`draft_model_update`), stopped items included;
    * **skipped** when ``target_model_stop_flags[b]``, or (unless ``is_splitwise_prefill``)
      ``tgt + num_model_step >= max_dec_len[b]``: ``stop_flags = True``,
      ``seq_lens_this_time = seq_lens_encoder = seq_lens_decoder = 0``, ``step_idx = 0``;
    * **prefill** (the draft's own ``seq_lens_encoder[b] > 0``): ``pre_ids[b, 0]`` and
      ``input_ids[b, enc - 1]`` get the first generated token ``accept_tokens[b, 0]`` (the
      prompt was stored shifted left by one), ``seq_lens_this_time = enc``,
      ``step_idx = tgt - 1``; ``seq_lens_decoder`` is kept;
    * **decode**: with ``a = accept_num[b]``: ``draft_tokens[b, :a] = accept_tokens[b, :a]``,
      ``pre_ids[b, tgt - a + i] = accept_tokens[b, i]``, ``seq_lens_decoder =
      target_model_seq_lens_decoder[b] - a``, ``step_idx = tgt - a``, ``seq_lens_this_time = a``.

    ``not_need_stop[0]`` = some item was not skipped.

    Args (``N`` items, ``W = K + 1``, ``C`` prompt capacity, ``L`` = max_model_len; per-item
    tensors may be ``[N]`` or ``[N, 1]``):
        draft_tokens: ``[N, W]`` int64, in/out (draft).
        input_ids: ``[N, C]`` int64, in/out (draft prompt, shifted left by one).
        stop_flags: ``[N, 1]`` bool, out (draft).
        seq_lens_this_time, seq_lens_encoder, seq_lens_decoder: ``[N]`` int32, in/out (draft).
        step_idx: ``[N, 1]`` int64, out (draft).
        not_need_stop: ``[1]`` bool, out, on the same device as the rest (no host round trip).
        pre_ids: ``[N, L]`` int64, in/out: draft history aligned with generated positions.
        accept_tokens: ``[N, W]`` int64, in (target). accept_num: ``[N]`` int32, in (target).
        target_model_seq_lens_encoder: ``[N]`` int32, in (checked, not read: as upstream).
        target_model_seq_lens_decoder: ``[N]`` int32, in.
        target_model_step_idx: ``[N, 1]`` int64, in. target_model_stop_flags: ``[N, 1]`` bool, in.
        max_dec_len: ``[N, 1]`` int64, in.
        target_model_draft_tokens: ``[N, W]`` int64, **in/out** (declared in place here;
            upstream writes it without declaring it).
        num_model_step: MTP substeps per round (>= 1).
        is_splitwise_prefill: True on a splitwise prefill node (no max_dec_len skip).

    Any ``N`` on every backend. Out-of-range data never writes outside a tensor:
    ``accept_num`` is clamped to ``[0, W]``; history/prompt writes outside the row are dropped.

    Raises:
        OpError: wrong dtype, rank, batch size, widths that disagree (``draft_tokens``,
            ``accept_tokens`` and ``target_model_draft_tokens`` must all be ``K + 1`` wide),
            ``num_model_step < 1``; nothing is modified.
    """
    run_paddle_op(
        "draft_model_preprocess",
        draft_tokens, input_ids, stop_flags, seq_lens_this_time, seq_lens_encoder,
        seq_lens_decoder, step_idx, not_need_stop, pre_ids, accept_tokens, accept_num,
        target_model_seq_lens_encoder, target_model_seq_lens_decoder, target_model_step_idx,
        target_model_stop_flags, max_dec_len, target_model_draft_tokens,
        int(num_model_step), bool(is_splitwise_prefill),
    )
