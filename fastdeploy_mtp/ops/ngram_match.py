"""ngram_match: the plain n-gram proposer (prompt lookup decoding, no MTP)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ._loader import run_paddle_op
from .hybrid_mtp_ngram import token_threshold

if TYPE_CHECKING:  # pragma: no cover
    import paddle

THRESHOLD_ENV = "INFER_WITH_REFERENCE_TOKENUM_THRESHOLD"
THRESHOLD_DEFAULT = 128


def ngram_match(
    input_ids: "paddle.Tensor",
    input_ids_len: "paddle.Tensor",
    token_ids_all: "paddle.Tensor",
    prompt_lens: "paddle.Tensor",
    step_idx: "paddle.Tensor",
    draft_token_num: "paddle.Tensor",
    draft_tokens: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    max_dec_len: "paddle.Tensor",
    max_ngram_size: int = 3,
    max_draft_tokens: int = 5,
    threshold: Optional[int] = None,
    num_threads: int = 0,
) -> None:
    """Propose drafts for each decode item from n-gram matches (in place).

    Per item ``b``, in batch order:

    * prefill (``seq_lens_encoder[b] > 0``): unchanged;
    * idle (``seq_lens_decoder[b] == 0``): ``seq_lens_this_time[b] = 0``;
    * decode: ``seq_lens_this_time[b] = 1`` (its last token), budget
      ``= min(draft_token_num[b], max_dec_len[b] - step_idx[b] - 1)``; the history is
      ``token_ids_all[b, prompt_lens[b]:]`` and the pattern ends at its ``step_idx[b]``;
      ``n`` from ``max_ngram_size`` down to 1; prompt ``input_ids[b, :input_ids_len[b]]``
      first, then the history before ``step_idx``; the leftmost occurrence followed by at
      least one token wins; the tokens go to ``draft_tokens[b, 1:]`` and
      ``seq_lens_this_time[b] = 1 + count``.
    * Global token threshold, upstream's CPU rule: ``sum`` = running total of
      ``seq_lens_this_time[0..b]`` (updated values), ``left`` = items with
      ``seq_lens_encoder > 0 or seq_lens_decoder > 0`` not yet processed as decode items
      (prefill items stay counted); budget capped at ``threshold - sum - left``; no drafts
      when ``sum + left >= threshold - 1``.

    Args:
        input_ids: ``[N, L]`` int64, in. Prompt tokens.
        input_ids_len: ``[N]``/``[N, 1]`` int64, in.
        token_ids_all: ``[N, L2]`` int64, in. Prompt followed by generated tokens.
        prompt_lens: ``[N]``/``[N, 1]`` int64, in.
        step_idx: ``[N]``/``[N, 1]`` int64, in.
        draft_token_num: ``[N]``/``[N, 1]`` int32, in. Per-item draft budget.
        draft_tokens: ``[N, K+1]`` int64, **in/out**.
        seq_lens_this_time: ``[N]``/``[N, 1]`` int32, **in/out**.
        seq_lens_encoder, seq_lens_decoder: ``[N]``/``[N, 1]`` int32, in.
        max_dec_len: ``[N]``/``[N, 1]`` int64, in.
        max_ngram_size: largest n (``>= 1``). max_draft_tokens: upstream's attr (the
            budget is per item, from ``draft_token_num``).
        threshold: ``None`` (default): ``INFER_WITH_REFERENCE_TOKENUM_THRESHOLD`` if set,
            else 128, as upstream; read here, never inside the op.
        num_threads: CPU search threads (``0``: automatic; ignored on CUDA); never changes
            the result.

    Deviations (docs/compat.md): identical CPU/CUDA results including the threshold; any
    batch size; no per-call device allocation; the budget never exceeds the draft row
    (``draft_tokens.shape[1] - 1``); out-of-range lengths and steps are clamped/ignored.

    Raises:
        OpError: naming the bad tensor or attr; nothing written.

    Example::

        # prompt 5 6 7 8; generated 1 6 (step_idx 1): "6" -> "7 8"
        draft = paddle.to_tensor([[6, -1, -1]], dtype="int64")
        slt = paddle.to_tensor([1], dtype="int32")
        ngram_match(paddle.to_tensor([[5, 6, 7, 8]], dtype="int64"),
                    paddle.to_tensor([4], dtype="int64"),
                    paddle.to_tensor([[5, 6, 7, 8, 1, 6, 0, 0]], dtype="int64"),
                    paddle.to_tensor([4], dtype="int64"), paddle.to_tensor([1], dtype="int64"),
                    paddle.to_tensor([2], dtype="int32"), draft, slt,
                    paddle.to_tensor([0], dtype="int32"), paddle.to_tensor([5], dtype="int32"),
                    paddle.to_tensor([100], dtype="int64"), 3, 2)
        # draft[0, 1:3] == [7, 8], slt == [3]
    """
    if threshold is None:
        threshold = token_threshold(THRESHOLD_ENV, THRESHOLD_DEFAULT)
    run_paddle_op(
        "ngram_match",
        input_ids, input_ids_len, token_ids_all, prompt_lens, step_idx, draft_token_num,
        draft_tokens, seq_lens_this_time, seq_lens_encoder, seq_lens_decoder, max_dec_len,
        int(max_ngram_size), int(max_draft_tokens), int(threshold), int(num_threads),
    )
