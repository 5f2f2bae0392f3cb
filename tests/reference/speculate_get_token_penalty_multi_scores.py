"""numpy reference of speculate_get_token_penalty_multi_scores (contract: docs/ops.md,
"speculate_get_token_penalty_multi_scores").

``logits`` is float32, float16 or bfloat16 carried as uint16 bit patterns
(tests/support/backends.py); the three score tensors have the same dtype. Returns
``{"logits": ...}``, the only tensor the op writes, as the op leaves it.
"""

from __future__ import annotations

import numpy as np

NAMES = (
    "token_ids_all",
    "prompt_lens",
    "logits",
    "penalty_scores",
    "frequency_scores",
    "presence_scores",
    "temperatures",
    "bad_tokens",
    "bad_tokens_len",
    "cur_len",
    "min_len",
    "eos_token_id",
    "seq_lens_this_time",
    "batch_id_per_token_output",
    "cu_seqlens_q_output",
    "step_input_ids",
)
FLT_MAX = np.float32(np.finfo(np.float32).max)


def _kind(a: np.ndarray) -> str:
    return {
        np.dtype(np.float32): "float32",
        np.dtype(np.float16): "float16",
        np.dtype(np.uint16): "bfloat16",
    }[a.dtype]


def ban_value(kind: str) -> np.float32:
    """-1e10, or -1e4 for float16 (as float32, before it is stored in the dtype)."""
    return np.float32(-1e4) if kind == "float16" else np.float32(-1e10)


def to_f32(a: np.ndarray, kind: str) -> np.ndarray:
    """The stored values as float32, exactly (NaN payloads kept)."""
    a = np.asarray(a)
    if kind == "float32":
        return a.astype(np.float32)
    if kind == "bfloat16":
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    h = a.view(np.uint16).astype(np.uint32)
    nan = ((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0)
    nan_bits = ((h & 0x8000) << 16) | 0x7F800000 | ((h & 0x3FF) << 13)
    finite = np.where(nan, np.float16(0), a).astype(np.float32)
    return np.where(nan, nan_bits.view(np.float32), finite).astype(np.float32)


def from_f32(x: np.ndarray, kind: str) -> np.ndarray:
    """float32 values stored in the dtype: round to nearest even; a NaN is quiet and keeps the
    top bits of its payload."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if kind == "float32":
        return x.copy()
    if kind == "bfloat16":
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)
    with np.errstate(over="ignore"):
        half = np.where(nan, np.float32(0), x).astype(np.float16).view(np.uint16).astype(np.uint64)
    nan_bits = ((u >> 16) & 0x8000) | 0x7E00 | ((u & 0x7FFFFF) >> 13)
    return np.where(nan, nan_bits, half).astype(np.uint16).view(np.float16)


def counted_ids(token_ids_all, prompt_lens, step_input_ids, cur_len, b: int, j: int, vocab: int):
    """(ids, counts) of the sequence that penalises row j of item b."""
    if int(cur_len[b]) < 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    width = token_ids_all.shape[1]
    p = min(max(int(prompt_lens[b]), 0), width)
    gen = token_ids_all[b, p:]
    negative = np.nonzero(gen < 0)[0]
    if len(negative):
        gen = gen[: negative[0]]
    seq = [gen]
    if step_input_ids is not None and step_input_ids.shape[1] > 1:
        seq.append(step_input_ids[b, 1 : 1 + min(j, step_input_ids.shape[1] - 1)])
    s = np.concatenate(seq).astype(np.int64)
    s = s[(s >= 0) & (s < vocab)]
    return np.unique(s, return_counts=True)


def speculate_get_token_penalty_multi_scores(
    token_ids_all,
    prompt_lens,
    logits,
    penalty_scores,
    frequency_scores,
    presence_scores,
    temperatures,
    bad_tokens,
    bad_tokens_len,
    cur_len,
    min_len,
    eos_token_id,
    seq_lens_this_time,
    batch_id_per_token_output,
    cu_seqlens_q_output,
    step_input_ids=None,
    max_seq_len=0,
) -> dict[str, np.ndarray]:
    out = np.array(logits, copy=True)
    kind = _kind(out)
    n = seq_lens_this_time.reshape(-1).shape[0]
    rows, vocab = out.shape
    flat = {
        "prompt_lens": prompt_lens.reshape(-1),
        "alpha": to_f32(penalty_scores.reshape(-1), kind),
        "beta": to_f32(frequency_scores.reshape(-1), kind),
        "gamma": to_f32(presence_scores.reshape(-1), kind),
        "temperature": temperatures.reshape(-1).astype(np.float32),
        "bad_len": bad_tokens_len.reshape(-1),
        "cur_len": cur_len.reshape(-1),
        "min_len": min_len.reshape(-1),
        "batch_id": batch_id_per_token_output.reshape(-1),
        "cu": cu_seqlens_q_output.reshape(-1),
    }
    eos = eos_token_id.reshape(-1)
    eos = eos[(eos >= 0) & (eos < vocab)]
    ban = ban_value(kind)
    for r in range(rows):
        b = int(flat["batch_id"][r])
        if b < 0 or b >= n:
            continue
        j = max(r - int(flat["cu"][b]), 0)
        row = out[r]
        # 1. minimum length
        cur = int(flat["cur_len"][b])
        if cur >= 0 and cur + j < int(flat["min_len"][b]):
            row[eos] = from_f32(np.full(len(eos), ban, np.float32), kind)
        # 2-3. counts and penalties
        ids, counts = counted_ids(
            token_ids_all, flat["prompt_lens"], step_input_ids, flat["cur_len"], b, j, vocab
        )
        if len(ids):
            alpha = flat["alpha"][b]
            if not alpha > 0:
                alpha = np.float32(1)
            x = to_f32(row[ids], kind)
            with np.errstate(all="ignore"):
                x = np.where(x < 0, x * alpha, x / alpha).astype(np.float32)
                shift = counts.astype(np.float32) * flat["beta"][b] + flat["gamma"][b]
                row[ids] = from_f32(x - shift, kind)
        # 4. temperature
        t = flat["temperature"][b]
        if t > 0 and t <= FLT_MAX:
            with np.errstate(all="ignore"):
                row[:] = from_f32(to_f32(row, kind) / t, kind)
        # 5. bad words
        width = bad_tokens.shape[1]
        nb = min(max(int(flat["bad_len"][b]), 0), width)
        bad = bad_tokens[b, :nb]
        bad = bad[(bad >= 0) & (bad < vocab)]
        row[bad] = from_f32(np.full(len(bad), ban, np.float32), kind)
    return {"logits": out}
