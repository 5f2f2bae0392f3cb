"""numpy reference of draft_model_update (contract: docs/ops.md, "draft_model_update").

The compacted index of an item is the number of earlier items whose *input*
seq_lens_this_time is > 0, counted from a snapshot taken before any write
(docs/compat.md, section 2).
"""

from __future__ import annotations

import numpy as np

NAMES = (
    "inter_next_tokens",
    "draft_tokens",
    "pre_ids",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "step_idx",
    "cu_seqlens_q_output",
    "stop_flags",
    "not_need_stop",
    "max_dec_len",
    "end_ids",
    "base_model_draft_tokens",
)


def draft_model_update(*tensors, max_seq_len: int, substep: int) -> dict[str, np.ndarray]:
    t = {name: np.array(x, copy=True) for name, x in zip(NAMES, tensors)}
    tokens = t["inter_next_tokens"].reshape(-1)
    slt = t["seq_lens_this_time"].reshape(-1)
    enc = t["seq_lens_encoder"].reshape(-1)
    dec = t["seq_lens_decoder"].reshape(-1)
    step = t["step_idx"].reshape(-1)
    stop = t["stop_flags"].reshape(-1)
    max_dec = t["max_dec_len"].reshape(-1)
    draft, pre_ids, base = t["draft_tokens"], t["pre_ids"], t["base_model_draft_tokens"]
    snapshot = slt.copy()
    bsz = slt.shape[0]
    stopped_count = 0
    k = 0
    for b in range(bsz):
        if snapshot[b] <= 0:
            continue
        tok = tokens[k] if k < tokens.shape[0] else -1
        k += 1
        if stop[b]:
            draft[b, 0] = -1
            base[b, substep + 1] = -1
            stopped_count += 1
        elif enc[b] > 0:
            dec[b] = enc[b] + dec[b]
            enc[b] = 0
            if pre_ids.shape[1] > 1:
                pre_ids[b, 1] = tok
            step[b] += 1
            draft[b, 0] = tok
            if step[b] < max_dec[b]:
                base[b, substep + 1] = tok
        elif dec[b] > 0:
            if step[b] >= max_dec[b] - 1:
                base[b, substep + 1] = -1
            else:
                dec[b] += snapshot[b]
                draft[b, 0] = tok
                base[b, substep + 1] = tok
                step[b] += snapshot[b]
                if 0 <= step[b] < pre_ids.shape[1]:
                    pre_ids[b, step[b]] = tok
        slt[b] = 0 if stop[b] else 1
        if stop[b]:
            enc[b] = 0
    t["not_need_stop"].reshape(-1)[0] = stopped_count < bsz
    return t
