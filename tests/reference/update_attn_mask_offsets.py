"""numpy reference of update_attn_mask_offsets (contract: docs/ops.md,
"update_attn_mask_offsets").

Returns ``(attn_mask_offsets, decode_states)`` as the op leaves them.
"""

from __future__ import annotations

import numpy as np


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
    for b in range(slt.shape[0]):
        if block[b] or (enc[b] == 0 and dec[b] == 0):
            continue
        q = int(cu_seqlens_q[b])
        if enc[b] > 0:
            resume = states.shape[1] > 0 and states[b, 0] == 2 and dec[b] > 0
            for i in range(int(slt[b])):
                if not 0 <= q + i < token_num:
                    continue
                if resume:
                    out[2 * (q + i) + 1] = dec[b] + slt[b]
                elif i < max_len:
                    out[2 * (q + i) + 1] = attn_mask_offsets_full[b, i] + 1
        elif dec[b] > 0:
            for i in range(int(slt[b])):
                if 0 <= q + i < token_num:
                    out[2 * (q + i) + 1] = dec[b] + 1 + i
            for i in range(states.shape[1]):
                states[b, i] = 0 if (i < slt[b] and states[b, i] != 1) else -1
    return out, states
