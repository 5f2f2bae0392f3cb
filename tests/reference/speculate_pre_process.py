"""numpy reference of speculate_pre_process (contract: docs/ops.md, "speculate_pre_process").

Returns the seven outputs (plus the inputs, unchanged) for the op's static form: inputs
(input_ids, seq_len, draft_tokens, seq_lens_encoder, seq_lens_decoder), attr cpu_token_num.
"""

from __future__ import annotations

import numpy as np

INPUTS = ("input_ids", "seq_len", "draft_tokens", "seq_lens_encoder", "seq_lens_decoder")
OUTPUTS = (
    "ids_remove_padding",
    "batch_id_per_token",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "cu_seq_lens_q_output",
    "batch_id_per_token_output",
    "real_output_token_num",
)


INT32_MAX = 2**31 - 1


def output_rows(n: int, enc: int) -> int:
    if n <= 0:
        return 0
    return 1 if n == 1 or enc != 0 else n


def speculate_pre_process(*tensors, cpu_token_num: int) -> dict[str, np.ndarray]:
    t = {name: np.array(x, copy=True) for name, x in zip(INPUTS, tensors)}
    input_ids, draft = t["input_ids"], t["draft_tokens"]
    slt = t["seq_len"].reshape(-1)
    enc = t["seq_lens_encoder"].reshape(-1)
    width = draft.shape[1]
    ids = np.full(cpu_token_num, 2, np.int64)
    batch_id = np.full(cpu_token_num, -1, np.int32)
    # bsz from seq_len; the other per-item arrays and the row matrices may have more rows
    bsz = slt.shape[0]
    batch_id_out = np.full(bsz * width, -1, np.int32)
    n_in = np.maximum(slt, 0).astype(np.int64)
    n_out = np.array([output_rows(int(slt[b]), int(enc[b])) for b in range(bsz)], np.int64)
    # int32 offsets: the prefix sums saturate at 2**31 - 1 (lengths are never rejected)
    cu_q = np.minimum(np.concatenate([[0], np.cumsum(n_in)]), INT32_MAX).astype(np.int32)
    cu_out = np.minimum(np.concatenate([[0], np.cumsum(n_out)]), INT32_MAX).astype(np.int32)
    for b in range(bsz):
        from_draft = width > 0 and enc[b] <= 0
        # the item's tokens at positions cu_q[b] .. cu_q[b + 1] - 1 that are < T
        for i in range(max(0, min(int(cu_q[b + 1]), cpu_token_num) - int(cu_q[b]))):
            pos = int(cu_q[b]) + i
            if from_draft:
                ids[pos] = draft[b, i] if i < width else 2
            else:
                ids[pos] = input_ids[b, i] if i < input_ids.shape[1] else 2
            batch_id[pos] = b
        for j in range(max(0, min(int(cu_out[b + 1]), bsz * width) - int(cu_out[b]))):
            batch_id_out[int(cu_out[b]) + j] = b
    t.update(
        ids_remove_padding=ids,
        batch_id_per_token=batch_id,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_q.copy(),
        cu_seq_lens_q_output=cu_out,
        batch_id_per_token_output=batch_id_out,
        real_output_token_num=np.array([cu_out[-1]], np.int32),
    )
    return t
