"""Random op states several op tests draw from (the op's own test, the round chain, the
status update's and the CUDA emulator's tests): tensors in the op's input order."""

from __future__ import annotations

import numpy as np

#: pre-filled into outputs so a missed write shows
SENTINEL = -999
#: verify_draft_tokens' strategies (ops.VerifyStrategy's values)
TOPP, GREEDY, TARGET_MATCH, REJECTION = 0, 1, 2, 3
#: the end ids verify_state gives every slot
EOS = (2, 3)
#: candidates per row in verify_state's TOPP/REJECTION inputs
C = 4


def preprocess_state(rng, bsz, k, *, num_model_step=1, pre_len=64, prompt_len=48, mix=None):
    """A random mid-run batch: prefill, decode, stopped and near-max_dec_len items."""
    w = k + 1
    mix = mix or {"prefill": 0.25, "decode": 0.45, "stopped": 0.15, "near_max": 0.15}
    kinds = rng.choice(list(mix), size=bsz, p=np.array(list(mix.values())) / sum(mix.values()))
    max_dec = rng.integers(20, 40, size=(bsz, 1)).astype(np.int64)
    tgt_step = rng.integers(1, 15, size=(bsz, 1)).astype(np.int64)
    near = kinds == "near_max"
    tgt_step[near, 0] = max_dec[near, 0] - rng.integers(0, num_model_step + 1, size=near.sum())
    enc = np.where(kinds == "prefill", rng.integers(1, prompt_len, size=bsz), 0).astype(np.int32)
    accept_num = rng.integers(1, w + 1, size=bsz).astype(np.int32)
    tensors = [
        rng.integers(0, 1000, size=(bsz, w)).astype(np.int64),  # draft_tokens
        rng.integers(0, 1000, size=(bsz, prompt_len)).astype(np.int64),  # input_ids
        rng.random((bsz, 1)) < 0.5,  # stop_flags (overwritten for every item)
        np.full(bsz, -999, np.int32),  # seq_lens_this_time (sentinel)
        enc,
        rng.integers(0, 100, size=bsz).astype(np.int32),  # seq_lens_decoder
        np.full((bsz, 1), -999, np.int64),  # step_idx (sentinel)
        np.array([rng.random() < 0.5]),  # not_need_stop
        rng.integers(-1, 1000, size=(bsz, pre_len)).astype(np.int64),  # pre_ids
        rng.integers(0, 1000, size=(bsz, w)).astype(np.int64),  # accept_tokens
        accept_num,
        rng.integers(0, 50, size=bsz).astype(np.int32),  # target seq_lens_encoder (unused)
        rng.integers(10, 100, size=bsz).astype(np.int32),  # target seq_lens_decoder
        tgt_step,
        (kinds == "stopped").reshape(bsz, 1),  # target stop flags
        max_dec,
        rng.integers(0, 1000, size=(bsz, w)).astype(np.int64),  # target draft tokens
    ]
    return tensors


def postprocess_state(rng, bsz, width, *, p_stop=0.2, p_prefill=0.2, p_hole=0.4):
    draft = rng.integers(0, 50_000, size=(bsz, width), dtype=np.int64)
    draft[rng.random((bsz, width)) < p_hole] = -1
    slt = np.full((bsz,), SENTINEL, dtype=np.int32)
    enc = np.where(rng.random(bsz) < p_prefill, rng.integers(1, 4096, size=bsz), 0).astype(np.int32)
    stop = rng.random((bsz, 1)) < p_stop
    return [draft, slt, enc, stop]


def layout(slt, enc):
    """cu_seqlens_q_output and T_out as speculate_pre_process lays them out."""
    rows = np.where(slt <= 0, 0, np.where((slt == 1) | (enc != 0), 1, slt))
    cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    return cu[: len(slt)], int(cu[-1])


def verify_state(rng, bsz, k, strategy, *, real_bsz=None, vocab=8, p_match=0.7):
    """A random batch: prefill / decode / stopped / paused / slt == 0 / near max_dec_len /
    reasoning items; drafts from a small vocabulary so acceptances and EOS hits happen."""
    w = k + 1
    real_bsz = bsz if real_bsz is None else real_bsz
    kind = rng.choice(
        ["decode"] * 5 + ["prefill", "stopped", "paused", "empty", "reasoning"], size=bsz
    )
    slt = np.where(kind == "prefill", rng.integers(1, 40, bsz), rng.integers(1, w + 1, bsz)).astype(
        np.int32
    )
    slt[kind == "empty"] = 0
    enc = np.where(kind == "prefill", slt, 0).astype(np.int32)
    stop = (kind == "stopped").reshape(bsz, 1)
    paused = kind == "paused"
    reasoning = (kind == "reasoning").astype(np.int32).reshape(bsz, 1)
    step_idx = rng.integers(0, 200, (bsz, 1)).astype(np.int64)
    max_dec = (step_idx + rng.integers(1, 8, (bsz, 1))).astype(np.int64)  # often near the limit
    max_dec[rng.random(bsz) < 0.5] = 10_000
    inp = rng.integers(0, vocab, (bsz, w)).astype(np.int64)
    slt_real = slt[:real_bsz]
    cu, t_out = layout(slt_real, enc[:real_bsz])
    t_rows = max(t_out, 1)
    # the draft each row decides (for matching targets / candidates)
    row_draft = rng.integers(0, vocab, t_rows).astype(np.int64)
    for b in range(real_bsz):
        for i in range(max(0, min(int(slt[b]), w) - 1)):
            if cu[b] + i < t_out:
                row_draft[cu[b] + i] = inp[b, i + 1]
    match = rng.random(t_rows) < p_match
    target = np.where(match, row_draft, rng.integers(0, vocab, t_rows)).astype(np.int64)
    cand_ids = np.stack([rng.permutation(vocab)[:C] for _ in range(t_rows)]).astype(np.int64)
    put = match & (rng.random(t_rows) < 0.9)
    cand_ids[put, rng.integers(0, C, t_rows)[put]] = -7  # placeholder, then the draft
    for r in np.nonzero(put)[0]:
        row = cand_ids[r]
        row[row == row_draft[r]] = -8  # keep ids distinct
        row[row == -7] = row_draft[r]
        row[row == -8] = vocab + 1
    scores = rng.random((t_rows, C)).astype(np.float32)
    scores[rng.random((t_rows, C)) < 0.1] = 0.0
    lens = rng.integers(0, C + 1, t_rows).astype(np.int32)
    uniforms = rng.random((t_rows, 2)).astype(np.float32)
    tensors = [
        np.full((bsz, w), SENTINEL, np.int64),
        np.full((bsz,), SENTINEL, np.int32),
        inp,
        target if strategy in (GREEDY, TARGET_MATCH) else None,
        cand_ids if strategy in (TOPP, REJECTION) else None,
        scores if strategy in (TOPP, REJECTION) else None,
        lens if strategy in (TOPP, REJECTION) else None,
        rng.uniform(0.3, 1.0, (bsz, 1)).astype(np.float32),
        stop,
        enc,
        slt_real.copy(),
        np.array(EOS, np.int64).reshape(-1, 1),
        paused,
        cu,
        reasoning,
        max_dec,
        step_idx,
        uniforms if strategy in (TOPP, REJECTION) else None,
    ]
    return tensors
