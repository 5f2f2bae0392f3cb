"""speculate_pre_process: pack the speculative batch into a flat token list."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

from ._loader import run_paddle_op

if TYPE_CHECKING:  # pragma: no cover
    import paddle


def speculate_pre_process(
    cpu_token_num: int,
    input_ids: "paddle.Tensor",
    seq_len: "paddle.Tensor",
    draft_tokens: "paddle.Tensor",
    seq_lens_encoder: "paddle.Tensor",
    seq_lens_decoder: "paddle.Tensor",
) -> Tuple["paddle.Tensor", ...]:
    """Lay out the tokens and the logit rows of one (target or draft) forward.

    The call form of FastDeploy's proposer: ``cpu_token_num`` (``T``, the host-side sum of
    ``seq_len``) comes first. For item ``b`` with ``n = seq_len[b]`` tokens:

    * token ``i < n`` is ``draft_tokens[b, i]`` when the item decodes (``W > 0`` and
      ``seq_lens_encoder[b] <= 0``), else ``input_ids[b, i]``; it goes to
      ``ids_remove_padding[cu_seqlens_q[b] + i]`` with ``batch_id_per_token = b``;
    * the item produces ``0`` logit rows if ``n == 0``, ``1`` if ``n == 1`` or it is in
      prefill (``seq_lens_encoder[b] != 0``), else ``n``; each row's
      ``batch_id_per_token_output`` entry is ``b``.

    Returns:
        ``(ids_remove_padding [T] int64, batch_id_per_token [T] int32, cu_seqlens_q [N+1]
        int32, cu_seqlens_k [N+1] int32 (= cu_seqlens_q), cu_seq_lens_q_output [N+1] int32,
        batch_id_per_token_output [N*W] int32, real_output_token_num [1] int32)``, new
        tensors on the inputs' device. Slots no token reaches hold the fill values
        (``2`` for ids, ``-1`` for batch ids); unlike upstream, the ``cu_*`` outputs are
        written even when ``T == 0``.

    Args (``N`` items, ``C`` prompt capacity, ``W = K + 1``):
        cpu_token_num: ``T`` >= 0. If it disagrees with ``sum(seq_len)``, tokens past ``T``
            are dropped (never written out of bounds) and uncovered slots keep their fill.
        input_ids: ``[N, C]`` int64. seq_len: ``[N]`` int32 (= seq_lens_this_time).
        draft_tokens: ``[N, W]`` int64. seq_lens_encoder: ``[N]`` int32.
        seq_lens_decoder: ``[N]`` int32 (unused, as upstream).

    Raises:
        OpError: bad dtype/rank/batch size or ``cpu_token_num < 0``.
    """
    return tuple(
        run_paddle_op(
            "speculate_pre_process",
            input_ids, seq_len, draft_tokens, seq_lens_encoder, seq_lens_decoder,
            int(cpu_token_num),
        )
    )
