"""numpy reference of mtp_step_paddle (contract: docs/ops.md, "mtp_step_paddle"), written in
upstream's list form: the need list is built once in step 2 and walked in step 4.

Deviation (docs/compat.md, section 3): when no running item holds a block, eviction stops
instead of looping forever, and needing items left without a free block are stopped and
dropped.
"""

from __future__ import annotations

import numpy as np

NAMES = (
    "base_model_stop_flags",
    "stop_flags",
    "batch_drop",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "block_tables",
    "encoder_block_lens",
    "used_list_len",
    "free_list",
    "free_list_len",
)


def mtp_step_paddle(*tensors, block_size: int, max_draft_tokens: int) -> dict[str, np.ndarray]:
    t = {name: np.array(x, copy=True) for name, x in zip(NAMES, tensors)}
    base_stop = t["base_model_stop_flags"].reshape(-1)
    stop = t["stop_flags"].reshape(-1)
    drop = t["batch_drop"].reshape(-1)
    slt = t["seq_lens_this_time"].reshape(-1)
    dec = t["seq_lens_decoder"].reshape(-1)
    tables = t["block_tables"]
    enc_len = t["encoder_block_lens"].reshape(-1)
    used = t["used_list_len"].reshape(-1)
    free_list = t["free_list"]
    free_len = t["free_list_len"].reshape(-1)
    # the batch is seq_lens_this_time's items; every other per-item tensor and block_tables
    # may have more rows, which are not read or written
    bsz, max_blocks = slt.shape[0], tables.shape[1]
    # values are clamped, never rejected: free_list_len to [0, F] (written back clamped),
    # negative lengths and counts read as 0
    free_len[0] = min(max(int(free_len[0]), 0), free_list.shape[0], 2**31 - 1)

    def count(v):
        return max(int(v), 0)

    def release(b, keep_encoder_lens):
        # the draft blocks after the prompt's: table slots [enc, enc + used) inside the row
        start = count(enc_len[b])
        for slot in range(start, min(start + count(used[b]), max_blocks)):
            if free_len[0] < free_list.shape[0]:
                free_list[free_len[0]] = tables[b, slot]
                free_len[0] += 1
            tables[b, slot] = -1
        if not keep_encoder_lens:
            enc_len[b] = 0
        used[b] = 0

    def drop_item(b):
        stop[b] = True
        drop[b] = True
        slt[b] = 0
        dec[b] = 0

    for b in range(bsz):
        if (base_stop[b] or drop[b]) and used[b] > 0:
            release(b, keep_encoder_lens=False)
    need = []
    for b in range(bsz):
        slot = (count(dec[b]) + max_draft_tokens + 1) // block_size
        if not base_stop[b] and not drop[b] and slot < max_blocks and tables[b, slot] == -1:
            need.append(b)
    while len(need) > free_len[0]:
        candidates = [b for b in range(bsz) if not base_stop[b]]
        if not candidates or max(used[b] for b in candidates) <= 0:
            break
        victim = max(candidates, key=lambda b: (used[b], -b))  # most used, then smallest b
        release(victim, keep_encoder_lens=True)  # an evicted item keeps its prompt blocks
        drop_item(victim)
    for b in need:
        if drop[b]:
            continue
        if free_len[0] <= 0:
            drop_item(b)
            continue
        used[b] = min(count(used[b]) + 1, 2**31 - 1)
        tables[b, (count(dec[b]) + max_draft_tokens + 1) // block_size] = free_list[free_len[0] - 1]
        free_len[0] -= 1
    return t
