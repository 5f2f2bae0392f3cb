"""numpy references of hybrid_mtp_ngram and ngram_match (contract: docs/ops.md, "The n-gram
ops (shared rules)", "hybrid_mtp_ngram", "ngram_match").

Written as upstream's canonical CPU loop: items in batch order, the token-number threshold
applied with the running sum of the already-updated ``seq_lens_this_time``, and for each
item the naive scan (n from max down to min, prompt first then history, leftmost match
that leaves at least one token). The ops compute the same result another way (one pass
per haystack, the threshold in closed form); these loops are the definition.

Out-of-range values, where upstream reads out of bounds, are defined here as the ops do:
``input_ids_len`` is clamped to ``[0, width]``; an item whose newest history token lies
outside its row gets no n-gram tokens; a negative ``seq_lens_this_time`` counts as 0 in
the running sum (and the item gets nothing); ``ngram_match`` never writes past the last
draft column.
"""

from __future__ import annotations

import numpy as np


def _leftmost(hay: np.ndarray, length: int, pattern: np.ndarray) -> int | None:
    """Leftmost i with hay[i:i+n] == pattern and i + n < length (a token follows)."""
    n = len(pattern)
    if length - n < 1:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(hay[: length - 1], n)
    hits = np.flatnonzero((windows == pattern).all(axis=1))
    return int(hits[0]) if hits.size else None


def naive_search(prompt, prompt_len, history, step, max_n, min_n, budget) -> np.ndarray:
    """The tokens upstream's scan proposes for one item (empty: no match)."""
    for n in range(max_n, min_n - 1, -1):
        if step < n:
            continue
        pattern = history[step - n + 1 : step + 1]
        for hay, length in ((prompt, prompt_len), (history, step)):
            i = _leftmost(hay, length, pattern)
            if i is not None:
                start = i + n
                return hay[start : min(start + budget, length)].copy()
    return np.zeros(0, np.int64)


def _flat(t: np.ndarray) -> np.ndarray:
    return t.reshape(-1)


def _threshold_budget(slt, b, budget, unprocessed, threshold):
    """Upstream's threshold step; None means the item is skipped."""
    total = int(np.maximum(slt[: b + 1].astype(np.int64), 0).sum())
    if total + budget + unprocessed > threshold:
        budget = min(budget, threshold - total - unprocessed)
    if total + unprocessed >= threshold - 1:
        return None
    return budget


def hybrid_mtp_ngram(
    input_ids,
    input_ids_len,
    pre_ids,
    step_idx,
    draft_token_num,
    draft_tokens,
    seq_lens_this_time,
    seq_lens_decoder,
    max_dec_len,
    max_ngram_size,
    min_ngram_size,
    max_draft_tokens,
    threshold=1024,
    num_threads=0,
) -> dict[str, np.ndarray]:
    del num_threads  # never changes the result
    draft = draft_tokens.copy()
    slt_out = seq_lens_this_time.copy()
    slt = _flat(slt_out)
    # per-item arrays may be padded past the batch: only their first bsz entries count
    lens, steps, dec, mdl = (
        _flat(t)[: slt.shape[0]] for t in (input_ids_len, step_idx, seq_lens_decoder, max_dec_len)
    )
    unprocessed = int((dec > 0).sum())
    for b in range(slt.shape[0]):
        ori = int(slt[b])
        step = int(steps[b])
        budget = min(max_draft_tokens - ori + 1, int(mdl[b]) - step - 1)
        if ori <= 0 or budget <= 0:
            continue
        unprocessed -= 1
        budget = _threshold_budget(slt, b, budget, unprocessed, threshold)
        if budget is None or step >= pre_ids.shape[1]:
            continue
        prompt_len = min(max(int(lens[b]), 0), input_ids.shape[1])
        tokens = naive_search(
            input_ids[b], prompt_len, pre_ids[b], step, max_ngram_size, min_ngram_size, budget
        )
        if tokens.size:
            draft[b, ori : ori + tokens.size] = tokens
            slt[b] = ori + tokens.size
    return {
        "input_ids": input_ids.copy(),
        "input_ids_len": input_ids_len.copy(),
        "pre_ids": pre_ids.copy(),
        "step_idx": step_idx.copy(),
        "draft_token_num": draft_token_num.copy(),
        "draft_tokens": draft,
        "seq_lens_this_time": slt_out,
        "seq_lens_decoder": seq_lens_decoder.copy(),
        "max_dec_len": max_dec_len.copy(),
    }


def ngram_match(
    input_ids,
    input_ids_len,
    token_ids_all,
    prompt_lens,
    step_idx,
    draft_token_num,
    draft_tokens,
    seq_lens_this_time,
    seq_lens_encoder,
    seq_lens_decoder,
    max_dec_len,
    max_ngram_size,
    max_draft_tokens,
    threshold=128,
    num_threads=0,
) -> dict[str, np.ndarray]:
    del max_draft_tokens, num_threads  # the budget is per item (draft_token_num)
    draft = draft_tokens.copy()
    slt_out = seq_lens_this_time.copy()
    slt = _flat(slt_out)
    # per-item arrays may be padded past the batch: only their first bsz entries count
    lens, pls, steps, dtn, enc, dec, mdl = (
        _flat(t)[: slt.shape[0]]
        for t in (
            input_ids_len,
            prompt_lens,
            step_idx,
            draft_token_num,
            seq_lens_encoder,
            seq_lens_decoder,
            max_dec_len,
        )
    )
    width = draft.shape[1]
    all_width = token_ids_all.shape[1]
    unprocessed = int(((enc > 0) | (dec > 0)).sum())
    for b in range(slt.shape[0]):
        step = int(steps[b])
        budget = min(int(dtn[b]), int(mdl[b]) - step - 1, width - 1)
        if enc[b] > 0:
            continue
        if dec[b] == 0:
            slt[b] = 0
            continue
        slt[b] = 1
        unprocessed -= 1
        budget = _threshold_budget(slt, b, budget, unprocessed, threshold)
        pl = min(max(int(pls[b]), 0), all_width)
        if budget is None or budget <= 0 or step >= all_width - pl:
            continue
        prompt_len = min(max(int(lens[b]), 0), input_ids.shape[1])
        tokens = naive_search(
            input_ids[b], prompt_len, token_ids_all[b, pl:], step, max_ngram_size, 1, budget
        )
        if tokens.size:
            draft[b, 1 : 1 + tokens.size] = tokens
            slt[b] = 1 + tokens.size
    return {
        "input_ids": input_ids.copy(),
        "input_ids_len": input_ids_len.copy(),
        "token_ids_all": token_ids_all.copy(),
        "prompt_lens": prompt_lens.copy(),
        "step_idx": step_idx.copy(),
        "draft_token_num": draft_token_num.copy(),
        "draft_tokens": draft,
        "seq_lens_this_time": slt_out,
        "seq_lens_encoder": seq_lens_encoder.copy(),
        "seq_lens_decoder": seq_lens_decoder.copy(),
        "max_dec_len": max_dec_len.copy(),
    }
