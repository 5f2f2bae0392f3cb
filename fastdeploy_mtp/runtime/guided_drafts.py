"""Grammar-aware MTP drafting (step 4 of :mod:`.guided`): in each substep a constrained
slot's draft logits are masked by its matcher's state after the drafts this round already
proposed for it, the matcher consumes the draft, and the round's end rolls every matcher
back and drops the drafts past a chain's end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .guided_stats import GuidedStats
from .guided_tokens import allows, masked_logits


@dataclass
class DraftChain:
    """One constrained slot's drafts in the current MTP round.

    Attributes:
        consumed: drafts its matcher consumed this round (rolled back at the round's end).
        valid: leading drafts that are grammar-valid (EOS included where the grammar may end).
        open: whether the next substep's draft may still be valid (no EOS drafted yet, the
            grammar not complete).
    """

    consumed: int = 0
    valid: int = 0
    open: bool = True


class GuidedDrafting:
    """The MTP side of the grammar matchers (a base of
    :class:`~fastdeploy_mtp.runtime.guided.GuidedSlots`, which sets the attributes below in
    its constructor and documents them)."""

    matchers: dict[int, Any]
    vocab_size: int
    eos_ids: tuple[int, ...]
    stats: GuidedStats
    _chains: dict[int, DraftChain]
    _draft_masks: dict[int, np.ndarray]
    _running: np.ndarray

    def mask_drafts(self, logits: Any, seq_lens_this_time: Any) -> Any:
        """One MTP substep: ``logits`` ``[R, V]`` (Paddle) with each constrained slot's
        disallowed tokens at ``-inf``: the mask of its matcher after the drafts this round
        already proposed for it. Row ``k`` belongs to the ``k``-th draft slot with
        ``seq_lens_this_time > 0`` (``[N]`` int32 Paddle, the draft's at this substep: the
        running slots in slot order, as ``draft_model_update`` reads the tokens; rows past
        them are padding). Rows of other slots, and of slots whose chain closed (see
        :class:`DraftChain`), are unchanged. Every rank of a tensor-parallel group computes
        the same masks (the matchers are deterministic and consume rank 0's drafts)."""
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        t0 = time.perf_counter()
        running = np.flatnonzero(seq_lens_this_time.numpy().reshape(-1) > 0)
        self._draft_masks = {}
        self._running = running
        rows: dict[int, int] = {}  # logit row -> slot
        for k, b in enumerate(int(b) for b in running):
            matcher = self.matchers.get(b)
            if matcher is None:
                continue
            chain = self._chains.setdefault(b, DraftChain())
            chain.open = chain.open and not (matcher.is_stopped() or matcher.is_error())
            if chain.open:
                rows[k] = b
        if not rows:
            self.stats.seconds += time.perf_counter() - t0
            return logits
        masks = allocate_token_bitmask(len(rows), self.vocab_size)
        packed = np.full([int(logits.shape[0]), masks.shape[1]], -1, np.int32)
        for i, (k, b) in enumerate(rows.items()):
            fill_next_token_bitmask(self.matchers[b], masks, i)
            packed[k] = self._draft_masks[b] = masks[i]
        out = masked_logits(logits, packed)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def take_drafts(self, tokens: Any) -> None:
        """After :meth:`mask_drafts`: the drafts sampled (``[R]`` int64 Paddle, row by row as
        there). A constrained slot's matcher consumes its draft when the mask allowed it and it
        is not an EOS id; an EOS draft ends the slot's chain (valid), a disallowed one (a row
        with no allowed finite logit) ends it before that draft."""
        t0 = time.perf_counter()
        tokens = tokens.numpy().reshape(-1)
        for k, b in enumerate(int(b) for b in self._running):
            mask = self._draft_masks.get(b)
            if mask is None:
                continue
            chain, token = self._chains[b], int(tokens[k])
            if not allows(mask, token):
                chain.open = False
                continue
            chain.valid += 1
            if token in self.eos_ids:
                chain.open = False
            else:
                self.matchers[b].consume_token(token)
                chain.consumed += 1
        self._draft_masks = {}
        self.stats.seconds += time.perf_counter() - t0

    def end_drafts(self, target: Any, limit: Callable[[Any, np.ndarray], None]) -> None:
        """The end of an MTP round: every matcher rolls back the drafts it consumed (back to
        "output so far"); where a slot's chain closed, ``limit(target, limits)`` (the
        ``limit_drafts`` of ``target``, the runner's ``share_inputs``) drops its drafts past
        the valid ones, which no grammar state allows (other slots keep ``K``)."""
        t0 = time.perf_counter()
        n, k = int(target.draft_tokens.shape[0]), int(target.draft_tokens.shape[1]) - 1
        limits: np.ndarray | None = None
        for b, chain in self._chains.items():
            if chain.consumed:
                self.matchers[b].rollback(chain.consumed)
            if not chain.open:
                if limits is None:
                    limits = np.full(n, k, np.int64)
                limits[b] = chain.valid
        self._chains = {}
        self.stats.seconds += time.perf_counter() - t0
        if limits is not None:
            limit(target, limits)
