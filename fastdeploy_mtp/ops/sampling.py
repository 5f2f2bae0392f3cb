"""Sampling helpers for the target-side verify step.

* :class:`VerifyStrategy` — the ``verify_strategy`` attr of :func:`verify_draft_tokens`
  (declared with the C++ constants in ``custom_ops/ops/constants.toml``).
* :func:`rejection_candidates` — candidate rows for ``VerifyStrategy.REJECTION`` from the
  target's probabilities: top-k, then top-p, then the top ``C`` entries, with
  ``len`` = the number of nonzero entries (the candidate rows REJECTION expects; see
  docs/ops.md, "verify_draft_tokens").
* :func:`position_uniforms` / :func:`verify_uniforms` — counter-based uniforms keyed by
  ``(request seed, absolute position, column)``: Philox-4x32-10 in numpy. A request's
  result then depends only on its seed and positions, not on its batch slot, the batch
  composition, warm-up calls or the TP rank, and a recomputation reproduces itself. Each
  absolute position is decided exactly once per request (a rejected position is settled by
  the replacement draw in the same step), so no uniform is ever reused.
* :func:`topp_uniforms` — the ``u_draw`` that ``VerifyStrategy.TOPP`` uses when
  :func:`verify_draft_tokens` gets no ``verify_uniforms``: the same Philox-4x32-10, keyed
  by a fixed seed, the slot and the item's ``step_idx`` (the kernels compute it
  themselves; this is the same function in numpy, for references and tests).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

# Philox-4x32 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
_PHILOX_M0 = np.uint64(0xD2511F53)
_PHILOX_M1 = np.uint64(0xCD9E8D57)
_PHILOX_W0 = np.uint64(0x9E3779B9)
_PHILOX_W1 = np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def _philox4x32_10(
    c0: ArrayLike, c1: ArrayLike, c2: ArrayLike, c3: ArrayLike, k0: ArrayLike, k1: ArrayLike
) -> np.ndarray:
    """Ten Philox rounds on uint64 arrays holding 32-bit words; returns the first word."""
    x0, x1, x2, x3 = (np.asarray(c, np.uint64) & _MASK32 for c in (c0, c1, c2, c3))
    key0 = np.asarray(k0, np.uint64) & _MASK32
    key1 = np.asarray(k1, np.uint64) & _MASK32
    for _ in range(10):
        p0 = _PHILOX_M0 * x0
        p1 = _PHILOX_M1 * x2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        x0, x1, x2, x3 = hi1 ^ x1 ^ key0, lo1, hi0 ^ x3 ^ key1, lo0
        key0 = (key0 + _PHILOX_W0) & _MASK32
        key1 = (key1 + _PHILOX_W1) & _MASK32
    return x0


def position_uniforms(seed: ArrayLike, position: ArrayLike, column: ArrayLike) -> np.ndarray:
    """Uniforms in ``[0, 1)`` (float32, multiples of 2**-24), one per broadcast element of
    ``(seed, position, column)``: Philox-4x32-10 with key = the 64-bit seed and counter =
    (64-bit absolute position, column, 0). Pure function of its arguments.

    Example::

        position_uniforms(1234, np.arange(5), 0)   # five uniforms for positions 0..4
    """
    seed, position, column = np.broadcast_arrays(
        np.asarray(seed, np.int64), np.asarray(position, np.int64), np.asarray(column, np.int64)
    )
    s = seed.astype(np.uint64)
    p = position.astype(np.uint64)
    word = _philox4x32_10(p, p >> np.uint64(32), column.astype(np.uint64), 0, s, s >> np.uint64(32))
    return ((word >> np.uint64(8)).astype(np.float64) * 2.0**-24).astype(np.float32)


# The fixed key of TOPP's built-in uniforms ("mtp_topp"); the kernels' copy is kTopPSeed in
# custom_ops/include/fdmtp/verify_draft_tokens.h (tests check that both agree).
TOPP_SEED = 0x6D74705F746F7070


def topp_uniforms(slot: ArrayLike, step_idx: ArrayLike) -> np.ndarray:
    """TOPP's Phase-2 uniform when ``verify_uniforms`` is None, one per broadcast element of
    ``(slot, step_idx)``: Philox-4x32-10 with key = ``TOPP_SEED`` and counter =
    (64-bit ``step_idx``, 64-bit slot); float32 in ``[0, 1)``, multiples of 2**-24.

    Example::

        topp_uniforms(np.arange(4), step_idx.reshape(-1))  # u_draw of slots 0..3 this step
    """
    slot, step_idx = np.broadcast_arrays(np.asarray(slot, np.int64), np.asarray(step_idx, np.int64))
    b = slot.astype(np.uint64)
    s = step_idx.astype(np.uint64)
    k = np.uint64(TOPP_SEED)
    word = _philox4x32_10(s, s >> np.uint64(32), b, b >> np.uint64(32), k, k >> np.uint64(32))
    return ((word >> np.uint64(8)).astype(np.float64) * 2.0**-24).astype(np.float32)


def verify_uniforms(
    seeds: np.ndarray,
    prompt_lens: np.ndarray,
    step_idx: np.ndarray,
    seq_lens_this_time: np.ndarray,
    seq_lens_encoder: np.ndarray,
    cu_seqlens_q_output: np.ndarray,
    num_rows: int,
) -> np.ndarray:
    """The ``verify_uniforms`` input ``[num_rows, 2]`` float32 for one verify step.

    Item ``b`` (``seq_lens_this_time[b] > 0``) owns rows ``r0 = cu_seqlens_q_output[b]``
    onwards: one row in prefill (``seq_lens_encoder[b] != 0``) or when
    ``seq_lens_this_time[b] == 1``, else ``seq_lens_this_time[b]`` rows. Row ``r0 + i``
    decides the token at absolute position ``prompt_lens[b] + step_idx[b] + i``; its
    column ``c`` is ``position_uniforms(seeds[b], that position, c)`` (c = 0: u_acc,
    c = 1: u_draw). Rows no item owns are 0. All per-item arrays have shape ``[N]`` or
    ``[N, 1]``.
    """
    seeds, prompt_lens, step_idx, enc, cu = (
        np.asarray(x).reshape(-1)
        for x in (seeds, prompt_lens, step_idx, seq_lens_encoder, cu_seqlens_q_output)
    )
    slt = np.asarray(seq_lens_this_time).reshape(-1)
    out = np.zeros((num_rows, 2), np.float32)
    for b in range(slt.shape[0]):
        if slt[b] <= 0:
            continue
        rows = 1 if enc[b] != 0 else int(slt[b])
        r = int(cu[b]) + np.arange(rows)
        keep = (r >= 0) & (r < num_rows)
        pos = int(prompt_lens[b]) + int(step_idx[b]) + np.arange(rows)
        for c in (0, 1):
            out[r[keep], c] = position_uniforms(int(seeds[b]), pos[keep], c)
    return out


def rejection_candidates(
    probs: np.ndarray,
    max_candidates: int,
    top_k: np.ndarray | None = None,
    top_p: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate rows for ``VerifyStrategy.REJECTION`` from probabilities ``[T, V]``.

    Per row: sort descending (ties: smaller id first); top-k keeps the first
    ``top_k[r]`` (``<= 0``: no limit) and renormalises; top-p keeps the shortest prefix
    whose mass reaches ``top_p[r]`` (a token is kept while the mass *before* it is
    ``< top_p``); then the first ``C = max_candidates`` entries. Returns
    ``(ids int64 [T, C], scores float32 [T, C], lens int32 [T])``: scores are the filtered
    probabilities (not renormalised after the top-C cut; the kernel divides by their sum),
    zero past the filtered support, and ``lens`` = the number of nonzero scores. When the
    filtered support is larger than ``C`` the row is a truncation, exact only with respect
    to the top-C renormalised distribution.
    """
    probs = np.asarray(probs, np.float64)
    t, v = probs.shape
    c = int(max_candidates)
    if c < 1:
        raise ValueError(f"max_candidates must be >= 1, got {c}")
    order = np.argsort(-probs, axis=1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=1)
    rank = np.arange(v)[None, :]
    if top_k is not None:
        k = np.asarray(top_k).reshape(-1)[:, None]
        sorted_p = np.where((k <= 0) | (rank < k), sorted_p, 0.0)
    total = sorted_p.sum(axis=1, keepdims=True)
    sorted_p = np.divide(sorted_p, total, out=np.zeros_like(sorted_p), where=total > 0)
    if top_p is not None:
        p = np.asarray(top_p, np.float64).reshape(-1)[:, None]
        before = np.cumsum(sorted_p, axis=1) - sorted_p
        sorted_p = np.where(before < p, sorted_p, 0.0)
    cols = min(c, v)
    ids = np.zeros((t, c), np.int64)
    scores = np.zeros((t, c), np.float32)
    ids[:, :cols] = order[:, :cols]
    scores[:, :cols] = sorted_p[:, :cols]
    lens = np.count_nonzero(scores > 0, axis=1).astype(np.int32)
    return ids, scores, lens
