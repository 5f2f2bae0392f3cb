"""numpy reference of the token messages (contract: docs/ops.md, "The messaging ops (shared
rules)", "speculate_save_output_topk", "speculate_get_output_topk", "mtp_save_first_token",
"mtp_get_first_token").

The encoders return the message text (the bytes after ``mtype``) a save op sends; the
decoders fill the reader ops' buffers from such a text.
"""

from __future__ import annotations

import numpy as np

MAX_BSZ, K, MAX_DRAFT = 512, 20, 6
FIRST_MAX_BSZ = 256
ENTRY_INTS = MAX_DRAFT * (K + 1)  # tokens (and scores) per batch entry
ENTRY_DTYPE = np.dtype(
    [("tokens", "<i4", ENTRY_INTS), ("scores", "<f4", ENTRY_INTS), ("ranks", "<i4", MAX_DRAFT)]
)
META_INTS = 3 + MAX_BSZ


def encode_topk(
    sampled_token_ids, logprob_token_ids, logprob_scores, logprob_ranks, token_num_per_batch,
    cu_batch_token_offset, not_need_stop, seq_lens_decoder, prompt_lens, preempted_idx,
    message_flag, msg_id=1,
) -> bytes:  # fmt: skip
    counts = np.asarray(token_num_per_batch).reshape(-1)
    bsz = counts.shape[0]
    offsets = np.asarray(cu_batch_token_offset).reshape(-1)
    dec = np.asarray(seq_lens_decoder).reshape(-1)
    prompt = np.asarray(prompt_lens).reshape(-1)
    preempted = np.asarray(preempted_idx).reshape(-1)
    sampled = np.asarray(sampled_token_ids).reshape(-1)
    ids = np.asarray(logprob_token_ids)
    scores = np.asarray(logprob_scores, np.float32)
    ranks = np.asarray(logprob_ranks).reshape(-1)
    width = ids.shape[1]
    meta = np.zeros(META_INTS, "<i4")
    meta[0] = msg_id if bool(np.asarray(not_need_stop).reshape(-1)[0]) else -msg_id
    meta[1] = message_flag
    meta[2] = bsz
    entries = np.zeros(bsz, ENTRY_DTYPE)
    for b in range(bsz):
        if preempted[b] == 1:
            meta[3 + b] = -9
            continue
        n = int(counts[b]) if dec[b] >= prompt[b] else 0
        meta[3 + b] = n
        for j in range(n):
            r = int(offsets[b]) + j
            tok = np.full(K + 1, -1, np.int64)
            sc = np.zeros(K + 1, np.float32)
            tok[0] = sampled[r]
            tok[1:width] = ids[r, 1:width]
            sc[:width] = scores[r, :width]
            entries[b]["tokens"][j * (K + 1) : (j + 1) * (K + 1)] = tok.astype(np.int32)
            entries[b]["scores"][j * (K + 1) : (j + 1) * (K + 1)] = sc
            entries[b]["ranks"][j] = np.int32(ranks[r])
    return meta.tobytes() + entries.tobytes()


def decode_topk(text: bytes, real_k: int, output_tokens, output_scores, output_ranks) -> None:
    """Fills the buffers (numpy, modified in place) as speculate_get_output_topk does."""
    meta = np.frombuffer(text[: 4 * META_INTS], "<i4")
    bsz = int(meta[2])
    entries = np.frombuffer(text[4 * META_INTS :], ENTRY_DTYPE, count=bsz)
    tokens, scores, ranks = (
        output_tokens.reshape(-1),
        output_scores.reshape(-1),
        output_ranks.reshape(-1),
    )
    tokens[:3] = meta[:3]
    for b in range(bsz):
        count = int(meta[3 + b])
        tokens[3 + b] = count
        for j in range(min(max(count, 0), MAX_DRAFT)):
            for k in range(real_k + 1):
                i = j * (K + 1) + k
                tokens[3 + MAX_BSZ + b * ENTRY_INTS + i] = entries[b]["tokens"][i]
                scores[b * ENTRY_INTS + i] = entries[b]["scores"][i]
            ranks[b * MAX_DRAFT + j] = entries[b]["ranks"][j]


def encode_first_token(
    x, not_need_stop, seq_lens_decoder, prompt_lens, step_idx, skip_chunk_prefill, msg_id=1
) -> bytes:
    x = np.asarray(x)
    bsz = x.shape[0]
    dec = np.asarray(seq_lens_decoder).reshape(-1)
    prompt = np.asarray(prompt_lens).reshape(-1)
    step = np.asarray(step_idx).reshape(-1)
    text = np.zeros(2 + FIRST_MAX_BSZ * (1 + MAX_DRAFT), "<i4")
    text[0] = msg_id if bool(np.asarray(not_need_stop).reshape(-1)[0]) else -msg_id
    text[1] = bsz
    for b in range(bsz):
        if (skip_chunk_prefill and dec[b] < prompt[b]) or step[b] != 1:
            continue
        text[2 + b] = 2
        base = 2 + FIRST_MAX_BSZ + MAX_DRAFT * b
        text[base : base + 2] = x[b, :2]
    return text.tobytes()


def decode_first_token(text: bytes, output_tokens) -> None:
    """Fills the buffer (numpy, modified in place) as mtp_get_first_token does."""
    ints = np.frombuffer(text, "<i4")
    out = output_tokens.reshape(-1)
    out[:2] = ints[:2]
    for b in range(int(ints[1])):
        out[2 + b] = ints[2 + b]
        base = 2 + FIRST_MAX_BSZ + MAX_DRAFT * b
        n = min(max(int(ints[2 + b]), 0), MAX_DRAFT)
        out[base : base + n] = ints[base : base + n]
