"""numpy reference of verify_draft_tokens (contract: docs/ops.md, "verify_draft_tokens").

Takes the op's 18 tensors (numpy; absent optional inputs are None) and its attrs (the 5
upstream ones, optionally a 6th: keep_max_dec_len_token, default False), and returns every
tensor as the op leaves it (None stays None). Float sums use np.float32
scalars in candidate order, as the kernels do, so tokens match bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastdeploy_mtp.ops.sampling import topp_uniforms

NAMES = (
    "step_output_ids",
    "step_output_len",
    "step_input_ids",
    "target_tokens",
    "candidate_ids",
    "candidate_scores",
    "candidate_lens",
    "topp",
    "stop_flags",
    "seq_lens_encoder",
    "seq_lens_this_time",
    "end_tokens",
    "is_block_step",
    "cu_seqlens_q_output",
    "reasoning_status",
    "max_dec_len",
    "step_idx",
    "verify_uniforms",
)
TOPP, GREEDY, TARGET_MATCH, REJECTION = 0, 1, 2, 3
ACCEPT_ALL_EOS_REPLACEMENT = 5
F0 = np.float32(0.0)


def _flat(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.asarray(a).reshape(-1)


def verify_draft_tokens(
    tensors: Sequence[np.ndarray | None], attrs: Sequence
) -> dict[str, np.ndarray | None]:
    t = dict(zip(NAMES, (None if a is None else np.array(a, copy=True) for a in tensors)))
    _max_seq_len, _verify_window, strategy, reject_all, accept_all, *rest = attrs
    keep_limit_token = bool(rest[0]) if rest else False
    out = t["step_output_ids"]
    out_len = t["step_output_len"].reshape(-1)  # view: writes land in the returned array
    inp = t["step_input_ids"]
    max_bsz, width = out.shape
    slt_all = _flat(t["seq_lens_this_time"])
    real_bsz = slt_all.shape[0]
    end = _flat(t["end_tokens"])
    stop, enc, paused = (
        _flat(t["stop_flags"]),
        _flat(t["seq_lens_encoder"]),
        _flat(t["is_block_step"]),
    )
    cu, reasoning = _flat(t["cu_seqlens_q_output"]), _flat(t["reasoning_status"])
    max_dec, step_idx, topp = _flat(t["max_dec_len"]), _flat(t["step_idx"]), _flat(t["topp"])
    target = _flat(t["target_tokens"])
    ids, scores, lens, uni = (
        t["candidate_ids"],
        t["candidate_scores"],
        _flat(t["candidate_lens"]),
        t["verify_uniforms"],
    )
    if strategy in (GREEDY, TARGET_MATCH):
        num_rows = target.shape[0]
    elif uni is None:  # TOPP without uniforms: the built-in generator (docs/ops.md)
        num_rows = ids.shape[0]
    else:
        num_rows = min(ids.shape[0], uni.shape[0])
    c = ids.shape[1] if ids is not None else 1

    def row_len(r):
        return int(min(max(int(lens[r]), 0), c))

    def row_mass(r, token):
        s, sd, found = F0, F0, False
        for j in range(row_len(r)):
            s = np.float32(s + scores[r, j])
            if not found and ids[r, j] == token:
                sd, found = scores[r, j], True
        return s, np.float32(sd)

    def accepts(r, d):
        if strategy == TOPP:
            return d in ids[r, : row_len(r)]
        if strategy == REJECTION:
            s, sd = row_mass(r, d)
            return bool(s > 0 and np.float32(uni[r, 0] * s) < sd)
        return target[r] == d

    def draw(r, b, rejected, excluded):
        if strategy == TOPP:
            u = topp_uniforms(b, step_idx[b]) if uni is None else uni[r, 1]
            tt = np.float32(u * topp[b])
            cum = F0
            for j in range(row_len(r)):
                cum = np.float32(cum + scores[r, j])
                if tt <= cum:
                    return ids[r, j]
            return ids[r, 0]
        if strategy == REJECTION:
            n = row_len(r)
            s, sd = row_mass(r, excluded)
            if n == 0 or not s > 0:
                return ids[r, 0]
            mass = np.float32(s - sd) if rejected else s
            tt = np.float32(uni[r, 1] * mass)
            cum, last = F0, -1
            for j in range(n):
                if rejected and ids[r, j] == excluded:
                    continue
                cum = np.float32(cum + scores[r, j])
                if scores[r, j] > 0:
                    last = j
                if tt < cum:
                    return ids[r, j]
            return ids[r, last] if last >= 0 else excluded
        return target[r]

    for b in range(max_bsz):
        out[b, :] = -1
        out_len[b] = 0
        if width == 0 or b >= real_bsz or paused[b] or stop[b] or slt_all[b] <= 0:
            continue
        slt = int(slt_all[b])
        r0 = int(cu[b])
        state = {"step": int(step_idx[b]), "n": 0, "stopped": False}

        def emit(pos, tok, final):
            state["step"] = min(state["step"] + 1, 2**63 - 1)
            eos = tok in end
            hit = state["step"] >= max_dec[b]
            if hit and not eos and not keep_limit_token:
                tok = end[0]
            out[b, pos] = tok
            state["n"] += 1
            if not final and (eos or hit):
                state["stopped"] = True

        def row_ok(r):
            return 0 <= r < num_rows

        rejected, excluded, i = False, 0, 0
        if not (reject_all or enc[b] != 0 or reasoning[b] == 1):
            while i < min(slt, width) - 1:
                d = inp[b, i + 1]
                if accept_all:
                    emit(i, ACCEPT_ALL_EOS_REPLACEMENT if d in end else d, False)
                    if state["stopped"]:
                        break
                    i += 1
                    continue
                if not row_ok(r0 + i):
                    break
                if not accepts(r0 + i, d):
                    rejected, excluded = True, d
                    break
                emit(i, d, False)
                if state["stopped"]:
                    break
                i += 1
        if not state["stopped"] and row_ok(r0 + i):
            emit(i, draw(r0 + i, b, rejected, excluded), True)
        out_len[b] = state["n"]
    return t
