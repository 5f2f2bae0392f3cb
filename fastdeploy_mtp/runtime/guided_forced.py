"""Free drafts from the grammar: where a constrained request's grammar forces its next tokens
(llguidance's fast-forward tokens), they go into the target's draft row ahead of the
drafting method's, and are counted as offered and accepted on their own.

A forced token is the grammar's only continuation from the request's output so far, so with a
tokenizer of single-byte tokens (the shipped models') it is the only token the target's masked
row allows: a forced draft is always accepted unless the request ends before it (``max_tokens``).
With merged tokens (BPE) the forced text is llguidance's canonical tokenization of it, which the
target may tokenize differently; such a draft is still grammar-valid, so the grammar check
before verification never cuts it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..constants import PLACEHOLDER_TOKEN_ID
from .guided_stats import GuidedStats


def merge_forced(row: np.ndarray, n: int, forced: Sequence[int]) -> int:
    """Put ``forced`` (at most ``K`` tokens) into draft row ``row`` in place.

    Args:
        row: ``[K + 1]`` int64 host draft row of a decoding slot (column 0 its last token,
            then its drafts; ``-1`` = none).
        n: the slot's ``seq_lens_this_time``: ``1 +`` the drafts already in the row.
        forced: the tokens the slot's grammar forces next.

    Returns:
        The slot's new ``seq_lens_this_time``: ``1 + len(forced)`` plus the drafts already in
        the row that follow the forced prefix (kept only if they agree with all of it: a draft
        made after a different prefix is dropped), at most ``K + 1``.
    """
    k = int(row.shape[0]) - 1
    if len(forced) > k:
        raise ValueError(f"`forced` has {len(forced)} tokens, more than the row's {k} drafts")
    drafts = row[1:n]
    f = len(forced)
    agree = len(drafts) >= f and all(int(d) == t for d, t in zip(drafts[:f], forced))
    kept = len(drafts) if agree else f
    row[1 : f + 1] = forced
    row[kept + 1 :] = PLACEHOLDER_TOKEN_ID
    return kept + 1


class GuidedForcing:
    """The forced drafts of the grammar matchers (a base of
    :class:`~fastdeploy_mtp.runtime.guided.GuidedSlots`, which sets the attributes below and
    calls :meth:`_count_offered` from ``prepare`` and :meth:`_count_accepted` from
    ``advance``).

    Attributes:
        _advanced: the slots whose matcher consumed this step's emitted tokens (``advance``):
            the constrained slots that decode next step, their matchers at "output so far".
        _forced: per slot, the forced drafts placed in its row this round.
        _offered: per slot, those of them the target verifies this step (the leading drafts
            of its row that are still the forced ones after the grammar check).
    """

    matchers: dict[int, Any]
    stats: GuidedStats
    _advanced: set[int]
    _forced: dict[int, list[int]]
    _offered: dict[int, list[int]]

    def forced_drafts(self, k: int) -> dict[int, list[int]]:
        """Per constrained slot that decodes next step (its matcher advanced this step), the
        first ``k`` tokens its grammar forces next (llguidance's ``compute_ff_tokens``; none
        once the grammar is complete). The matchers' states do not change; every rank of a
        tensor-parallel group gets the same tokens."""
        t0 = time.perf_counter()
        out: dict[int, list[int]] = {}
        for idx in self._advanced:
            forced = [int(t) for t in self.matchers[idx].compute_ff_tokens()[:k]]
            if forced:
                out[idx] = forced
        self.stats.seconds += time.perf_counter() - t0
        return out

    def offer_forced(self, target: Any, forced: dict[int, list[int]] | None = None) -> np.ndarray:
        """After the proposer's round: each decoding slot's forced drafts into its row of
        ``target`` (the runner's ``share_inputs``: ``draft_tokens [N, K + 1]`` int64,
        ``seq_lens_this_time [N]`` int32, ``seq_lens_encoder [N]``), ahead of the drafts
        already there (:func:`merge_forced`).

        Args:
            target: the runner's ``share_inputs``.
            forced: per slot, its forced tokens (at most ``K``; ``None``: :meth:`forced_drafts`
                with ``K``).

        Returns:
            ``[N]`` int64: per slot, how many leading drafts of its row are forced (0 for a
            slot that is not constrained, not decoding, or whose grammar forces nothing).
        """
        n_slots, k = int(target.draft_tokens.shape[0]), int(target.draft_tokens.shape[1]) - 1
        counts = np.zeros(n_slots, np.int64)
        self._forced = {}
        if forced is None:
            forced = self.forced_drafts(k) if self._advanced else {}
        if not forced:
            return counts
        t0 = time.perf_counter()
        drafts = target.draft_tokens.numpy().copy()
        slt = target.seq_lens_this_time.numpy().reshape(-1).copy()
        enc = target.seq_lens_encoder.numpy().reshape(-1)
        for idx, tokens in forced.items():
            if slt[idx] > 0 and enc[idx] == 0:
                slt[idx] = merge_forced(drafts[idx], int(slt[idx]), tokens)
                counts[idx] = len(tokens)
                self._forced[idx] = list(tokens)
        if self._forced:
            import paddle

            paddle.assign(paddle.to_tensor(drafts), output=target.draft_tokens)
            paddle.assign(
                paddle.to_tensor(slt.reshape(target.seq_lens_this_time.shape)),
                output=target.seq_lens_this_time,
            )
        self.stats.seconds += time.perf_counter() - t0
        return counts

    def _count_offered(self, idx: int, drafts: list[int]) -> None:
        """Slot ``idx``'s drafts that reach verification (after the grammar check): its
        forced ones still in front of them count as offered."""
        forced = self._forced.get(idx)
        if not forced:
            return
        n = 0
        while n < min(len(forced), len(drafts)) and drafts[n] == forced[n]:
            n += 1
        if n:
            self._offered[idx] = forced[:n]
            self.stats.forced += n

    def _count_accepted(self, idx: int, emitted: np.ndarray) -> None:
        """Slot ``idx`` emitted ``emitted`` (its accepted drafts, then the target's token):
        the leading offered forced drafts among them count as accepted."""
        offered = self._offered.get(idx)
        if not offered:
            return
        n = 0
        while n < min(len(offered), len(emitted)) and int(emitted[n]) == offered[n]:
            n += 1
        self.stats.forced_accepted += n
