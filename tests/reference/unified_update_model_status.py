"""numpy reference of unified_update_model_status (contract: docs/ops.md,
"unified_update_model_status").

Takes the op's 14 tensors (numpy) and its attr ``keep_max_dec_len_token`` (default False:
the token reaching ``max_dec_len`` becomes ``end_tokens[0]``), and returns every tensor as
the op leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NAMES = (
    "seq_lens_encoder",
    "seq_lens_decoder",
    "has_running_seqs",
    "step_input_ids",
    "step_output_ids",
    "step_output_len",
    "stop_flags",
    "seq_lens_this_time",
    "is_paused",
    "token_ids_all",
    "prompt_lens",
    "step_idx",
    "end_tokens",
    "max_dec_len",
)
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def unified_update_model_status(
    tensors: Sequence[np.ndarray], keep_max_dec_len_token: bool = False
) -> dict[str, np.ndarray]:
    t = dict(zip(NAMES, (np.array(a, copy=True) for a in tensors)))
    # reshape(-1) of a contiguous copy is a view: writes land in the returned arrays
    enc, dec = t["seq_lens_encoder"].reshape(-1), t["seq_lens_decoder"].reshape(-1)
    out_len, stop = t["step_output_len"].reshape(-1), t["stop_flags"].reshape(-1)
    slt, step_idx = t["seq_lens_this_time"].reshape(-1), t["step_idx"].reshape(-1)
    paused, prompt = t["is_paused"].reshape(-1), t["prompt_lens"].reshape(-1)
    end, max_dec = t["end_tokens"].reshape(-1), t["max_dec_len"].reshape(-1)
    out, inp, hist = t["step_output_ids"], t["step_input_ids"], t["token_ids_all"]
    max_bsz, width = stop.shape[0], out.shape[1]  # rows past max_bsz are not read
    real_bsz = slt.shape[0]
    seq_len = hist.shape[1]
    any_running = False
    for b in range(max_bsz):
        if stop[b] or paused[b]:
            if b < real_bsz:  # padding slots past real_bsz are left alone
                stop[b] = True
                enc[b] = dec[b] = slt[b] = out_len[b] = 0
            continue
        # values are clamped, never rejected: the count into [0, W], the step counter at
        # the int64 maximum, the lengths at the int32 maximum
        n = min(max(int(out_len[b]), 0), width)
        old_step = int(step_idx[b])
        s = old_step
        stopped = False
        for k in range(n):
            s = min(s + 1, INT64_MAX)
            eos = out[b, k] in end
            if eos or s >= max_dec[b]:
                if not eos and not keep_max_dec_len_token:
                    out[b, k] = end[0]
                n, stopped = k + 1, True
                break
        if enc[b] > 0:
            dec[b] = min(int(dec[b]) + int(enc[b]), INT32_MAX)
            enc[b] = 0
        elif dec[b] > 0:
            dec[b] = min(int(dec[b]) + n, INT32_MAX)
        if stopped:
            stop[b] = True
        out_len[b] = n
        step_idx[b] = s
        if n > 0:
            first = int(prompt[b]) + old_step  # exact (Python ints)
            if first >= 0 and first + n < seq_len:  # all or nothing: prompt_len + new step < L
                hist[b, first : first + n] = out[b, :n]
            inp[b, 0] = out[b, n - 1]
        any_running = any_running or not stopped
    t["has_running_seqs"].reshape(-1)[0] = any_running
    return t
