"""verify_draft_tokens: the target decides each item's drafts and emits this step's tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ._loader import run_paddle_op
from .sampling import VerifyStrategy

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def verify_draft_tokens(
    step_output_ids: "paddle.Tensor",
    step_output_len: "paddle.Tensor",
    step_input_ids: "paddle.Tensor",
    target_tokens: Optional["paddle.Tensor"],
    candidate_ids: Optional["paddle.Tensor"],
    candidate_scores: Optional["paddle.Tensor"],
    candidate_lens: Optional["paddle.Tensor"],
    topp: "paddle.Tensor",
    stop_flags: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    end_tokens: "paddle.Tensor",
    is_block_step: "paddle.Tensor",
    cu_seqlens_q_output: "paddle.Tensor",
    reasoning_status: "paddle.Tensor",
    max_dec_len: "paddle.Tensor",
    step_idx: "paddle.Tensor",
    verify_uniforms: Optional["paddle.Tensor"] = None,
    max_seq_len: int = 0,
    verify_window: int = 2,
    verify_strategy: int = VerifyStrategy.TOPP,
    reject_all: bool = False,
    accept_all: bool = False,
) -> None:
    """Verify each item's drafts against the target's output rows; write the emitted tokens.

    ``N`` = slots (``step_output_ids.shape[0]``), ``W = K + 1``, ``real_bsz`` =
    ``seq_lens_this_time.shape[0] <= N``, ``T`` = output rows. Item ``b`` owns rows
    ``r0 = cu_seqlens_q_output[b]`` .. ``r0 + slt - 1`` (one row in prefill); row
    ``r0 + i`` is the target's prediction after ``step_input_ids[b, i]``, so it decides
    draft ``d = step_input_ids[b, i + 1]``.

    Per slot: the output row is reset to ``-1`` and the count to 0; padding
    (``b >= real_bsz``), paused (``is_block_step``), stopped and **``slt == 0``** items
    emit nothing. Phase 1 walks ``i = 0 .. min(slt, W) - 2`` and stops at the first
    rejected draft; each accepted draft is emitted. Phase 2 emits one more token from row
    ``r0 + i``. Emitting advances a local copy of ``step_idx``; at
    ``step_idx >= max_dec_len`` the token becomes ``end_tokens[0]`` (unless it is an EOS
    id) and an EOS id or that limit ends Phase 1 (no Phase-2 token then). Drafts are not
    looked at (Phase 2 only, one token) under ``reject_all``, in prefill
    (``seq_lens_encoder != 0``) and when ``reasoning_status == 1``; these beat
    ``accept_all``, which accepts every draft (an EOS draft becomes token 5, as upstream).
    ``step_idx`` is read only; :func:`unified_update_model_status` commits the step.

    ==================  =========================================  =============================================
    verify_strategy     Phase 1: accept draft ``d`` at row ``r``   Phase 2 token at row ``r``
    ==================  =========================================  =============================================
    ``TOPP`` (0)        ``d`` among ``candidate_ids[r, :len]``,    ``t = u_draw[r] * topp[b]``; first ``j`` with
                        ``len = min(candidate_lens[r], C)``        ``t <= cumsum(scores)[j]``, else ``ids[r, 0]``
    ``GREEDY`` (1)      ``d == target_tokens[r]`` (argmax)         ``target_tokens[r]``
    ``TARGET_MATCH`` 2  ``d == target_tokens[r]`` (a sample)       ``target_tokens[r]``
    ``REJECTION`` (3)   ``u_acc[r] * S < score(d)``, ``S`` = sum   after a rejection: a draw from the row without
                        of the row's first ``len`` scores          ``d`` (mass ``S - score(d)``); else from the
                                                                   whole row (``t = u_draw * S``, ``t < cum``)
    ==================  =========================================  =============================================

    REJECTION is lossless for a one-hot drafter: at a tested row the emitted token is
    distributed exactly as the row's (filtered) distribution p, since
    ``P(x) = p(d)[x = d] + (1 - p(d)) p(x)[x != d] / (1 - p(d)) = p(x)``; candidate rows
    must cover the filtered support (see :func:`fastdeploy_mtp.ops.rejection_candidates`)
    and the uniforms must be fresh per position (see
    :func:`fastdeploy_mtp.ops.verify_uniforms`). Sums run in candidate order in float32,
    so every backend gives the same tokens for the same inputs.

    Args:
        step_output_ids: ``[N, W]`` int64, **out** (``accept_tokens``): emitted tokens,
            ``-1`` after the last.
        step_output_len: ``[N]`` int32, **out** (``accept_num``).
        step_input_ids: ``[N, W]`` int64, in (``draft_tokens``): ``[last token, d1..]``.
        target_tokens: ``[T]`` or ``[T, 1]`` int64 or None; GREEDY/TARGET_MATCH.
        candidate_ids: ``[T, C]`` int64 or None; TOPP/REJECTION.
        candidate_scores: ``[T, C]`` float32 or None; TOPP/REJECTION (probabilities).
        candidate_lens: ``[T]`` int32 or None; TOPP/REJECTION (clamped to ``[0, C]``).
        topp: ``[N, 1]`` float32, in (TOPP's Phase-2 mass).
        stop_flags: ``[N, 1]`` bool, in.  seq_lens_encoder: ``[N]`` int32, in.
        seq_lens_this_time: ``[real_bsz]`` int32, in (``< 0`` rejected on CPU).
        end_tokens: ``[E]`` or ``[E, 1]`` int64, ``E >= 1`` EOS ids.
        is_block_step: ``[N]`` bool.  cu_seqlens_q_output: ``[>= real_bsz]`` int32.
        reasoning_status: ``[N, 1]`` int32.  max_dec_len, step_idx: ``[N, 1]`` int64, in.
        verify_uniforms: ``[>= T, 2]`` float32 or None: row ``r`` = (u_acc, u_draw) in
            ``[0, 1)``. Required by TOPP and REJECTION (TOPP uses column 1 where upstream
            used a hidden curand state; note ``[0, 1)`` here vs curand's ``(0, 1]``).
        max_seq_len, verify_window: accepted and unused (as upstream).
        verify_strategy: a :class:`VerifyStrategy` (0..3; anything else is an error).
        reject_all, accept_all: see above.

    Differences from FastDeploy (each pinned by a test, see ``docs/compat.md``): any
    ``N`` (upstream: one block, ``N <= 1024``); ``slt == 0`` items emit nothing; TOPP's
    uniforms are an input (no static curand state, no per-call allocation); the
    ``REJECTION`` strategy; rows outside the given row tensors are never read (a draft
    there is not tested, a final row there emits nothing).

    Raises:
        OpError: wrong dtype, shape, batch size, width (``step_input_ids`` vs
            ``step_output_ids``), device, a strategy's missing input, a bad
            ``verify_strategy``; the message names the argument and nothing is written.

    Example::

        # GREEDY, one item, drafts [7, 8] after last token 3; the target predicts 7, 9, 4
        ids = paddle.full([1, 3], -1, "int64"); n = paddle.zeros([1], "int32")
        verify_draft_tokens(ids, n, paddle.to_tensor([[3, 7, 8]], "int64"),
                            paddle.to_tensor([7, 9, 4], "int64"), None, None, None,
                            paddle.ones([1, 1]), paddle.zeros([1, 1], "bool"),
                            paddle.zeros([1], "int32"), paddle.to_tensor([3], "int32"),
                            paddle.to_tensor([[2]], "int64"), paddle.zeros([1], "bool"),
                            paddle.zeros([1], "int32"), paddle.zeros([1, 1], "int32"),
                            paddle.to_tensor([[100]], "int64"), paddle.zeros([1, 1], "int64"),
                            None, verify_strategy=VerifyStrategy.GREEDY)
        # ids == [[7, 9, -1]], n == [2]: d1 = 7 accepted, d2 = 8 rejected, 9 emitted
    """
    run_paddle_op(
        "verify_draft_tokens",
        step_output_ids,
        step_output_len,
        step_input_ids,
        target_tokens,
        candidate_ids,
        candidate_scores,
        candidate_lens,
        topp,
        stop_flags,
        seq_lens_encoder,
        seq_lens_this_time,
        end_tokens,
        is_block_step,
        cu_seqlens_q_output,
        reasoning_status,
        max_dec_len,
        step_idx,
        verify_uniforms,
        int(max_seq_len),
        int(verify_window),
        int(verify_strategy),
        bool(reject_all),
        bool(accept_all),
    )
