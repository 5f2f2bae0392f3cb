"""numpy reference of draft_model_postprocess (contract: docs/ops.md, "draft_model_postprocess").

Takes the op's four tensors (numpy) and returns every one of them as the op leaves it.
The batch size N is the length of ``base_model_seq_lens_this_time``; the other tensors may
have more rows, and only their rows 0..N-1 are read (the draft rows with the draft tensor's
own width).
"""

from __future__ import annotations

import numpy as np

PLACEHOLDER = -1


def draft_model_postprocess(
    base_model_draft_tokens: np.ndarray,
    base_model_seq_lens_this_time: np.ndarray,
    base_model_seq_lens_encoder: np.ndarray,
    base_model_stop_flags: np.ndarray,
) -> dict[str, np.ndarray]:
    draft = base_model_draft_tokens.copy()
    slt = base_model_seq_lens_this_time.copy()
    enc = base_model_seq_lens_encoder.reshape(-1)
    stop = base_model_stop_flags.reshape(-1)
    flat = slt.reshape(-1)  # a view: writes land in slt
    bsz = flat.shape[0]
    draft, enc, stop = draft[:bsz], enc[:bsz], stop[:bsz]  # rows past N are not read
    for b in range(bsz):
        if stop[b]:
            flat[b] = 0
        elif enc[b] == 0:
            # every non-placeholder entry counts, wherever it stands in the row
            flat[b] = np.count_nonzero(draft[b] != PLACEHOLDER)
        # prefill (enc != 0, not stopped): unchanged
    return {
        "base_model_draft_tokens": base_model_draft_tokens.copy(),
        "base_model_seq_lens_this_time": slt,
        "base_model_seq_lens_encoder": base_model_seq_lens_encoder.copy(),
        "base_model_stop_flags": base_model_stop_flags.copy(),
    }
