"""numpy reference of draft_model_preprocess (contract: docs/ops.md, "draft_model_preprocess").

Takes the op's 17 tensors and two attrs; returns every tensor as the op leaves it.
"""

from __future__ import annotations

import numpy as np

NAMES = (
    "draft_tokens",
    "input_ids",
    "stop_flags",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "step_idx",
    "not_need_stop",
    "pre_ids",
    "accept_tokens",
    "accept_num",
    "target_model_seq_lens_encoder",
    "target_model_seq_lens_decoder",
    "target_model_step_idx",
    "target_model_stop_flags",
    "max_dec_len",
    "target_model_draft_tokens",
)


def draft_model_preprocess(
    *tensors, num_model_step: int, is_splitwise_prefill: bool
) -> dict[str, np.ndarray]:
    t = {name: np.array(x, copy=True) for name, x in zip(NAMES, tensors)}
    flat = {
        name: t[name].reshape(-1)
        for name in NAMES
        if t[name].ndim <= 2
        and name
        not in (
            "draft_tokens",
            "input_ids",
            "pre_ids",
            "accept_tokens",
            "target_model_draft_tokens",
        )
    }
    bsz = flat["seq_lens_this_time"].shape[0]
    # every row tensor is read with its own width; a column a row lacks is skipped
    draft_w = t["draft_tokens"].shape[1]
    accept_w = t["accept_tokens"].shape[1]
    pre_len = t["pre_ids"].shape[1]
    any_kept = False
    for b in range(bsz):
        t["target_model_draft_tokens"][b, 1:] = -1
        tgt = int(flat["target_model_step_idx"][b])
        # tgt + num_model_step >= max_dec_len, in exact (unbounded) arithmetic
        skip = bool(flat["target_model_stop_flags"][b]) or (
            not is_splitwise_prefill and tgt + num_model_step >= int(flat["max_dec_len"][b])
        )
        if skip:
            flat["stop_flags"][b] = True
            flat["seq_lens_this_time"][b] = 0
            flat["seq_lens_decoder"][b] = 0
            flat["seq_lens_encoder"][b] = 0
            flat["step_idx"][b] = 0
            continue
        any_kept = True
        flat["stop_flags"][b] = False
        enc = int(flat["seq_lens_encoder"][b])
        if enc > 0:
            if accept_w > 0:  # the first token exists
                first = t["accept_tokens"][b, 0]
                if pre_len > 0:
                    t["pre_ids"][b, 0] = first
                if enc - 1 < t["input_ids"].shape[1]:
                    t["input_ids"][b, enc - 1] = first
            flat["seq_lens_this_time"][b] = enc
            flat["step_idx"][b] = _sat(tgt - 1, INT64)
        else:
            a = int(np.clip(flat["accept_num"][b], 0, accept_w))  # the accepted tokens that exist
            flat["seq_lens_decoder"][b] = _sat(
                int(flat["target_model_seq_lens_decoder"][b]) - a, INT32
            )
            flat["step_idx"][b] = _sat(tgt - a, INT64)
            n_draft = min(a, draft_w)
            t["draft_tokens"][b, :n_draft] = t["accept_tokens"][b, :n_draft]
            for i in range(a):
                pos = tgt - a + i
                if 0 <= pos < pre_len:
                    t["pre_ids"][b, pos] = t["accept_tokens"][b, i]
            flat["seq_lens_this_time"][b] = a
    flat["not_need_stop"][0] = any_kept
    return t


INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def _sat(v: int, bounds: tuple[int, int]) -> int:
    """Saturating store: values past the dtype's range stick at its limit (no wrap)."""
    return min(max(v, bounds[0]), bounds[1])
