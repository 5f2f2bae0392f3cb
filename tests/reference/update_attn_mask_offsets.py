"""numpy reference of update_attn_mask_offsets (contract: docs/ops.md,
"update_attn_mask_offsets").

Returns ``(attn_mask_offsets, decode_states)`` as the op leaves them.
"""

from __future__ import annotations

import numpy as np

INT32_MAX = 2**31 - 1


def update_attn_mask_offsets(
    ids_remove_padding,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    cu_seqlens_q,
    attn_mask_offsets_full,
    is_block_step,
    decode_states,
):
    token_num = ids_remove_padding.shape[0]
    out = np.zeros(2 * token_num, dtype=np.int32)  # even slots (window starts) stay 0
    states = decode_states.copy()
    slt = seq_lens_this_time.reshape(-1)
    enc = seq_lens_encoder.reshape(-1)
    dec = seq_lens_decoder.reshape(-1)
    block = is_block_step.reshape(-1)
    max_len = attn_mask_offsets_full.shape[1]
    for b in range(slt.shape[0]):  # entries past the batch (padded arrays) are not read
        if block[b] or (enc[b] == 0 and dec[b] == 0):
            continue
        q, n, d = int(cu_seqlens_q[b]), int(slt[b]), int(dec[b])
        # token i is served only when its slot q + i lies in [0, T): bounded by the buffer
        first, end = max(0, -q), min(n, token_num - q)
        if enc[b] > 0:
            resume = states.shape[1] > 0 and states[b, 0] == 2 and d > 0
            if not resume:
                end = min(end, max_len)  # never read past the full row
            for i in range(first, end):
                value = d + n if resume else int(attn_mask_offsets_full[b, i]) + 1
                out[2 * (q + i) + 1] = min(value, INT32_MAX)  # saturates, never wraps
        elif d > 0:
            for i in range(first, end):
                out[2 * (q + i) + 1] = min(d + 1 + i, INT32_MAX)
            for i in range(states.shape[1]):
                states[b, i] = 0 if (i < n and states[b, i] != 1) else -1
    return out, states
