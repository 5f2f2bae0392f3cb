"""The draft planner's acceptance estimates: per slot, drafting method and draft position,
the chance that the draft is accepted given the ones before it were, scored after every
verification for every method's candidates (see :mod:`.draft_planner`)."""

from __future__ import annotations

import numpy as np

from .draft_methods import METHODS

MTP = METHODS.index("mtp")


class AcceptanceEstimates:
    """The estimates (the base of :class:`~.draft_planner.DraftPlanner`).

    Args:
        k: ``K``, draft positions.
        num_slots: ``N``.
        window: ``acceptance_window`` (weight ``2 / (window + 1)``).
        methods: the method codes scored.
        mtp_fill: the MTP method fills the positions past its substeps with n-gram matches.

    Attributes:
        p: ``[len(METHODS), N, K]`` the estimates.
        prior: ``[len(METHODS), K]`` the same over every request (a new request starts there).
        candidates: the last round's candidate drafts ``[N, K]`` per method code (what
            :meth:`observe` scores); ``candidate_steps`` the MTP substeps of that round.
    """

    def __init__(
        self, k: int, num_slots: int, window: int, methods: tuple[int, ...], mtp_fill: bool
    ):
        self.k = k
        self.beta = 2.0 / (window + 1)
        self.methods = tuple(sorted(methods))
        self.mtp_fill = mtp_fill
        self.p = np.ones((len(METHODS), num_slots, k), np.float64)
        self.prior = np.ones((len(METHODS), k), np.float64)
        self.candidates: dict[int, np.ndarray] = {}
        self.candidate_steps = 0

    def observe(self, emitted: np.ndarray, accept_num: np.ndarray, decode_mask: np.ndarray) -> None:
        """Score every method's candidates of the last round against what the target emitted.

        Args:
            emitted: ``[N, >= K]`` tokens each slot emitted this step (accept_tokens).
            accept_num: ``[N]`` how many.
            decode_mask: ``[N]`` slots that decoded (verified drafts) this step.
        """
        if not self.candidates:  # (a round that scored none)
            return
        rows = np.asarray(decode_mask, bool)
        n = np.asarray(accept_num, np.int64).reshape(-1)
        pos = np.arange(self.k)[None, :]
        within = rows[:, None] & (pos < n[:, None])
        tokens = np.asarray(emitted)[:, : self.k]
        for code in self.methods:
            cand = self.candidates.get(code)
            if cand is None:  # not run (the MTP layer skipped): nothing to score
                continue
            eq = (cand == tokens) & (cand >= 0)
            # tested: the candidate's earlier drafts all equal the emitted tokens
            before = np.cumprod(np.concatenate([np.ones_like(eq[:, :1]), eq[:, :-1]], 1), 1)
            if code == MTP:  # the MTP layer's candidates are not known when planning: a draft
                # its round should have made (the n-gram fill past the substeps) and did not
                # counts as a miss, so its estimate covers whether the draft exists
                made = pos < (self.k if self.mtp_fill else self.candidate_steps)
            else:  # known when planning: only the drafts made are estimated
                made = cand >= 0
            tested = within & (before > 0) & made
            hit = eq.astype(np.float64)
            self.p[code] += np.where(tested, self.beta * (hit - self.p[code]), 0.0)
            n_tested = tested.sum(axis=0)
            rate = np.where(tested, hit, 0.0).sum(axis=0) / np.maximum(n_tested, 1)
            self.prior[code] += np.where(n_tested > 0, self.beta * (rate - self.prior[code]), 0.0)
