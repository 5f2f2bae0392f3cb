"""hybrid_mtp_ngram: fill the draft slots the MTP substeps left free with n-gram matches."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle

THRESHOLD_ENV = "SPEC_TOKENUM_THRESHOLD"
THRESHOLD_DEFAULT = 1024


def token_threshold(env_name: str, default: int) -> int:
    """Upstream's token-number threshold: the environment variable ``env_name`` if set
    (read here, in Python, at call time), else ``default``."""
    value = os.environ.get(env_name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{env_name}={value!r} is not an integer") from None


def hybrid_mtp_ngram(
    input_ids: "paddle.Tensor",
    input_ids_len: "paddle.Tensor",
    pre_ids: "paddle.Tensor",
    step_idx: "paddle.Tensor",
    draft_token_num: "paddle.Tensor",
    draft_tokens: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    max_dec_len: "paddle.Tensor",
    max_ngram_size: int = 5,
    min_ngram_size: int = 2,
    max_draft_tokens: int = 5,
    threshold: Optional[int] = None,
    num_threads: int = 0,
) -> None:
    """Append n-gram drafts after the MTP drafts in the target's draft rows (in place).

    Per item ``b`` with ``ori = seq_lens_this_time[b]`` tokens already in its draft row:

    * budget ``= min(max_draft_tokens - ori + 1, max_dec_len[b] - step_idx[b] - 1)``;
      items with ``ori == 0`` or budget ``<= 0`` are left alone;
    * pattern: ``pre_ids[b, step_idx-n+1 .. step_idx]`` (inclusive of ``step_idx``), for
      ``n`` from ``max_ngram_size`` down to ``min_ngram_size`` (``n <= step_idx``);
    * search the prompt ``input_ids[b, :input_ids_len[b]]`` first, then the history
      ``pre_ids[b, :step_idx]``; the **leftmost** occurrence followed by at least one
      token wins; up to budget following tokens (clamped to the haystack's end) are
      written to ``draft_tokens[b, ori:]`` and ``seq_lens_this_time[b]`` grows by their
      number. No match: the row and its length are unchanged.
    * Global token threshold, in batch order, exactly upstream's CPU rule: with ``sum``
      the running total of ``seq_lens_this_time[0..b]`` (earlier items already updated)
      and ``left`` the items with ``seq_lens_decoder > 0`` not yet processed, the budget is
      capped at ``threshold - sum - left`` and the item is skipped when
      ``sum + left >= threshold - 1``.

    Args:
        input_ids: ``[N, L]`` int64, in. The draft prompt (target prompt shifted by one).
        input_ids_len: ``[N]``/``[N, 1]`` int64, in. Valid tokens per row.
        pre_ids: ``[N, L2]`` int64, in. Draft history; newest token at ``step_idx``.
        step_idx: ``[N]``/``[N, 1]`` int64, in.
        draft_token_num: ``[N]``/``[N, 1]`` int32, in. Not used (upstream's signature).
        draft_tokens: ``[N, >= max_draft_tokens + 1]`` int64, **in/out** (target's).
        seq_lens_this_time: ``[N]``/``[N, 1]`` int32, **in/out** (target's).
        seq_lens_decoder: ``[N]``/``[N, 1]`` int32, in (counts items for the threshold).
        max_dec_len: ``[N]``/``[N, 1]`` int64, in.
        max_ngram_size, min_ngram_size, max_draft_tokens: upstream's attrs
            (``1 <= min_ngram_size <= max_ngram_size``).
        threshold: the global token-number threshold. ``None`` (default): the
            environment variable ``SPEC_TOKENUM_THRESHOLD`` if set, else 1024, as
            upstream. Read here in Python; the op itself never reads the environment.
        num_threads: CPU threads for the search (``0``: chosen from the amount of work;
            ignored on CUDA).
            Results never depend on it.

    Deviations from upstream (docs/compat.md): CPU and CUDA give identical results,
    threshold included (upstream's GPU path caps differently); any batch size; no host
    sync or per-call ``cudaMalloc`` on CUDA (scratch comes from Paddle's allocator);
    out-of-range ``input_ids_len``/``step_idx`` are clamped/ignored instead of read out
    of bounds; a negative ``seq_lens_this_time`` counts as 0 in the running sum.

    Raises:
        OpError: wrong dtype, rank, batch size, device, too few draft columns or bad
            attrs; the message names the tensor or attr, and nothing has been written.

    Example::

        # prompt 1 2 3 4 5 6, history ... 2 3 (newest at step_idx=4): "2 3" -> "4 5"
        input_ids = paddle.to_tensor([[1, 2, 3, 4, 5, 6]], dtype="int64")
        pre_ids = paddle.to_tensor([[9, 9, 9, 2, 3, 0, 0]], dtype="int64")
        draft = paddle.to_tensor([[7, 8, -1, -1, -1]], dtype="int64")
        slt = paddle.to_tensor([2], dtype="int32")
        hybrid_mtp_ngram(input_ids, paddle.to_tensor([6], dtype="int64"), pre_ids,
                         paddle.to_tensor([4], dtype="int64"), paddle.to_tensor([4], dtype="int32"),
                         draft, slt, paddle.to_tensor([5], dtype="int32"),
                         paddle.to_tensor([100], dtype="int64"), 3, 2, 3)
        # draft == [[7, 8, 4, 5, -1]], slt == [4]  (budget 3 - 2 + 1 = 2)
    """
    if threshold is None:
        threshold = token_threshold(THRESHOLD_ENV, THRESHOLD_DEFAULT)
    run_paddle_op(
        "hybrid_mtp_ngram",
        input_ids, input_ids_len, pre_ids, step_idx, draft_token_num, draft_tokens,
        seq_lens_this_time, seq_lens_decoder, max_dec_len,
        int(max_ngram_size), int(min_ngram_size), int(max_draft_tokens), int(threshold),
        int(num_threads),
    )
