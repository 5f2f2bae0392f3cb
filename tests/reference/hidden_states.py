"""numpy references of the hidden-state ops (contracts: docs/ops.md, "eagle_get_hidden_states",
"eagle_get_self_hidden_states", "eagle_gather_hidden_states").

Each takes the op's tensors (numpy; bfloat16 carried as uint16 bit patterns) and returns
the op's outputs ``(out, output_token_num)``. Rows are copied bit-exactly; rows that no
item fills are zero.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _nonneg(v) -> int:
    return max(int(v), 0)


def _gather(
    input_, bsz: int, out_rows: int, counts: Callable, source: Callable
) -> tuple[np.ndarray, np.ndarray]:
    """Items in batch order: item b owns `in` input rows and `out` output rows; its j-th
    output row copies its source(b, j, in)-th input row (zero if that row does not exist)."""
    out = np.zeros((out_rows, input_.shape[1]), dtype=input_.dtype)
    in_off = out_off = 0
    for b in range(bsz):
        n_in, n_out = counts(b)
        for j in range(n_out):
            row = out_off + j
            if row >= out_rows:
                break
            local = source(b, j, n_in)
            if 0 <= local < n_in and in_off + local < input_.shape[0]:
                out[row] = input_[in_off + local]
        in_off += n_in
        out_off += n_out
    # the total is summed exactly and saturates at the int32 limit (no wrap)
    return out, np.array([min(out_off, 2**31 - 1)], dtype=np.int32)


def eagle_get_hidden_states(
    input_,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    stop_flags,
    accept_nums,
    base_model_seq_lens_this_time,
    base_model_seq_lens_encoder,
    actual_draft_token_num=0,
):
    slt = seq_lens_this_time.reshape(-1)
    enc = seq_lens_encoder.reshape(-1)
    acc = accept_nums.reshape(-1)
    base = base_model_seq_lens_this_time.reshape(-1)

    def counts(b):
        if enc[b] > 0:  # draft prefill: every row (counted with the DRAFT's encoder length)
            return _nonneg(enc[b]), _nonneg(enc[b])
        if slt[b] <= 0:  # nothing to draft: skip the item's target rows
            return _nonneg(base[b]), 0
        return _nonneg(base[b]), _nonneg(acc[b])  # decode: the FIRST accept_num rows

    return _gather(input_, slt.shape[0], input_.shape[0], counts, lambda b, j, n_in: j)


def eagle_get_self_hidden_states(
    input_, last_seq_lens_this_time, seq_lens_this_time, seq_lens_encoder
):
    last = last_seq_lens_this_time.reshape(-1)
    slt = seq_lens_this_time.reshape(-1)
    enc = seq_lens_encoder.reshape(-1)

    def counts(b):
        n_last = _nonneg(last[b])
        if slt[b] > 0:
            return (1 if enc[b] > 0 else n_last), 1
        return ((1 if n_last > 0 else 0) if enc[b] > 0 else n_last), 0

    return _gather(input_, slt.shape[0], input_.shape[0], counts, lambda b, j, n_in: n_in - 1)


def eagle_gather_hidden_states(
    input_,
    cu_seqlens_q,
    seq_lens_this_time,
    seq_lens_decoder,
    seq_lens_encoder,
    batch_id_per_token_output,
    cu_seqlens_q_output,
    real_output_token_num,
):
    slt = seq_lens_this_time.reshape(-1)

    def counts(b):
        n = _nonneg(slt[b])
        return n, 1 if n > 0 else 0

    bsz = slt.shape[0]
    return _gather(input_, bsz, bsz, counts, lambda b, j, n_in: n_in - 1)
