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
    slot = substep + 1  # the host checks slot < base.shape[1]
    has_col0 = draft.shape[1] > 0  # every row tensor is read with its own width

    def set_base(b, value):
        if slot < base.shape[1]:
            base[b, slot] = value

    stopped_count = 0
    k = 0
    for b in range(bsz):
        if snapshot[b] <= 0:
            continue
        tok = tokens[k] if k < tokens.shape[0] else -1
        k += 1
        # lengths read clamped to [0, 2**31 - 1]; sums saturate instead of wrapping
        e, d, s = max(int(enc[b]), 0), max(int(dec[b]), 0), int(snapshot[b])
        if stop[b]:
            if has_col0:
                draft[b, 0] = -1
            set_base(b, -1)
            stopped_count += 1
        elif e > 0:
            dec[b] = _sat(e + d, INT32)
            enc[b] = 0
            if pre_ids.shape[1] > 1:
                pre_ids[b, 1] = tok
            step[b] = _sat(int(step[b]) + 1, INT64)
            if has_col0:
                draft[b, 0] = tok
            if step[b] < max_dec[b]:
                set_base(b, tok)
        elif d > 0:
            if int(step[b]) >= _sat(int(max_dec[b]) - 1, INT64):
                set_base(b, -1)
            else:
                dec[b] = _sat(d + s, INT32)
                if has_col0:
                    draft[b, 0] = tok
                set_base(b, tok)
                step[b] = _sat(int(step[b]) + s, INT64)
                if 0 <= step[b] < pre_ids.shape[1]:
                    pre_ids[b, step[b]] = tok
        slt[b] = 0 if stop[b] else 1
        if stop[b]:
            enc[b] = 0
    t["not_need_stop"].reshape(-1)[0] = stopped_count < bsz
    return t


INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def _sat(v: int, bounds: tuple[int, int]) -> int:
    return min(max(v, bounds[0]), bounds[1])
