"""unified_update_model_status: the target's stop decision and step commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def unified_update_model_status(
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
    has_running_seqs: "paddle.Tensor",
    step_input_ids: "paddle.Tensor",
    step_output_ids: "paddle.Tensor",
    step_output_len: "paddle.Tensor",
    stop_flags: "paddle.Tensor",
    seq_lens_this_time: "paddle.Tensor",
    is_paused: "paddle.Tensor",
    token_ids_all: "paddle.Tensor",
    prompt_lens: "paddle.Tensor",
    step_idx: "paddle.Tensor",
    end_tokens: "paddle.Tensor",
    max_dec_len: "paddle.Tensor",
) -> None:
    """Commit one target step: stop at EOS / max_dec_len, advance lengths, record history.

    ``N`` = slots (``stop_flags.shape[0]``), ``W = K + 1``, ``L`` = ``token_ids_all.shape[1]``,
    ``real_bsz`` = ``seq_lens_this_time.shape[0] <= N``. Per slot ``b``:

    * **running** (not stopped, not paused; padding slots included, as upstream): scan
      ``step_output_ids[b, :n]`` (``n = step_output_len[b]``): each token advances
      ``step_idx``; the first EOS id, or the token where ``step_idx >= max_dec_len``
      (replaced by ``end_tokens[0]`` unless it is an EOS id), stops the item and cuts
      ``n`` there. Then prefill (``enc > 0``): ``dec += enc; enc = 0`` (even when
      ``n == 0``); decode (``dec > 0``): ``dec += n``. ``step_output_len = n``;
      ``step_idx`` advanced by ``n``; the ``n`` tokens go to
      ``token_ids_all[b, prompt_len + old_step_idx + k]`` only if
      ``prompt_len + new_step_idx < L`` (all or nothing); ``step_input_ids[b, 0]`` = the
      last emitted token (if ``n > 0``); ``stop_flags[b]`` = True if it stopped.
    * **stopped or paused, ``b < real_bsz``**: ``stop_flags = True``; ``enc``, ``dec``,
      ``seq_lens_this_time`` and ``step_output_len`` = 0. Step, history, output row kept.
    * **stopped or paused, ``b >= real_bsz``**: untouched.

    ``has_running_seqs[0]`` = some slot is still running afterwards.

    Args:
        seq_lens_encoder, seq_lens_decoder: ``[N]`` int32, **in/out**.
        has_running_seqs: ``[1]`` bool, **out**; device memory for CUDA tensors
            (``not_need_stop_device``); never read back on the host.
        step_input_ids: ``[N, W]`` int64, **in/out** (column 0 only).
        step_output_ids: ``[N, W]`` int64, **in/out** (EOS replacement).
        step_output_len: ``[N]`` int32, **in/out** (in ``[0, W]``; checked on CPU).
        stop_flags: ``[N, 1]`` bool, **in/out**.
        seq_lens_this_time: ``[real_bsz]`` int32, **in/out** (stopped/paused only).
        is_paused: ``[N]`` bool, in (``is_block_step``).
        token_ids_all: ``[N, L]`` int64, **in/out** (history).
        prompt_lens: ``[N, 1]`` int64, in (``>= 0``; checked on CPU).
        step_idx: ``[N, 1]`` int64, **in/out**.
        end_tokens: ``[E]`` / ``[E, 1]`` int64, ``E >= 1``.  max_dec_len: ``[N, 1]`` int64.

    Differences from FastDeploy (pinned by tests, see ``docs/compat.md``): any ``N``
    (upstream: one block, ``N <= 1024``); ``has_running_seqs`` is computed without a
    block-wide reduction (stream-ordered clear, then running slots store True);
    out-of-range ``step_output_len`` / negative ``prompt_lens`` are errors on CPU and
    clamped / skipped on CUDA (never an out-of-bounds access).

    Raises:
        OpError: wrong dtype, shape, batch size, width, device or (CPU) value; the message
            names the argument and nothing is written.

    Example::

        # one decode item: step_idx 4 -> 6, tokens [11, 12] recorded after a 3-token prompt
        unified_update_model_status(enc, dec, has_running, draft, accept_tokens, accept_num,
                                    stop_flags, slt, is_block_step, token_ids_all,
                                    prompt_lens, step_idx, eos_ids, max_dec_len)
    """
    run_paddle_op(
        "unified_update_model_status",
        seq_lens_encoder,
        seq_lens_decoder,
        has_running_seqs,
        step_input_ids,
        step_output_ids,
        step_output_len,
        stop_flags,
        seq_lens_this_time,
        is_paused,
        token_ids_all,
        prompt_lens,
        step_idx,
        end_tokens,
        max_dec_len,
    )
