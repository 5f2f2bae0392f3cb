"""numpy reference of speculate_get_logits (contract: docs/ops.md, "speculate_get_logits").

Returns every tensor argument as the op leaves it (the op works in place).
"""

from __future__ import annotations

import numpy as np


def speculate_get_logits(
    draft_logits,
    next_token_num,
    batch_token_num,
    cu_next_token_offset,
    cu_batch_token_offset,
    logits,
    first_token_logits,
    seq_lens_this_time,
    seq_lens_encoder,
) -> dict[str, np.ndarray]:
    draft = draft_logits.copy()
    nxt = next_token_num.copy()
    bat = batch_token_num.copy()
    cu_next = cu_next_token_offset.copy()
    cu_batch = cu_batch_token_offset.copy()
    slt = seq_lens_this_time.reshape(-1)
    enc = seq_lens_encoder.reshape(-1)
    nxt_flat, bat_flat = nxt.reshape(-1), bat.reshape(-1)
    # Offsets saturate at the rows the buffers hold (and at the int32 range); an item's
    # counts are the differences of its offsets, so no row outside a tensor is touched.
    next_limit = min(logits.shape[0], 2**31 - 1)
    batch_limit = min(draft.shape[0], 2**31 - 1)
    next_off = batch_off = 0  # cu_*[0] is never written and is taken as 0
    for b in range(slt.shape[0]):
        prefill = enc[b] > 0
        want_next = 1 if prefill else max(int(slt[b]), 0)
        want_batch = 2 if prefill else max(int(slt[b]), 0)
        next_end = min(next_off + want_next, next_limit)
        batch_end = min(batch_off + want_batch, batch_limit)
        nxt_flat[b], bat_flat[b] = next_end - next_off, batch_end - batch_off
        for j in range(batch_end - batch_off):
            if prefill and j == 0:
                src = first_token_logits[b]
            else:
                row = next_off + (0 if prefill else j)
                src = logits[row] if row < logits.shape[0] else None
            if src is not None:
                draft[batch_off + j] = src
        next_off, batch_off = next_end, batch_end
        cu_next[b + 1] = next_off  # inclusive offsets, as upstream's GPU path
        cu_batch[b + 1] = batch_off
    return {
        "draft_logits": draft,
        "next_token_num": nxt,
        "batch_token_num": bat,
        "cu_next_token_offset": cu_next,
        "cu_batch_token_offset": cu_batch,
        "logits": logits.copy(),
        "first_token_logits": first_token_logits.copy(),
        "seq_lens_this_time": seq_lens_this_time.copy(),
        "seq_lens_encoder": seq_lens_encoder.copy(),
    }
