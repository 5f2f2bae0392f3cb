"""Adaptive draft length: each request drafts as many tokens as its observed acceptance pays
for, from ``num_speculative_tokens`` down to 0 (plain decoding) and back.

The rule (``speculative_config.adaptive_draft_length``):

* Per slot and draft position ``i = 1..K`` the controller keeps ``p_i``, an estimate of the
  probability that draft ``i`` is accepted *given* drafts ``1..i-1`` were: an exponential
  moving average with weight ``beta = 2 / (acceptance_window + 1)``, updated only for the
  positions the target actually tested (position ``i`` is tested when ``i`` drafts or more were
  proposed and the first ``i - 1`` were accepted). A new request starts optimistic
  (``p_i = 1``: it drafts ``K``).
* The slot's draft limit is the largest ``n`` with ``p_1 * ... * p_n >= threshold``
  (``acceptance_rate_threshold``): draft ``n`` is worth proposing while the chance that it is
  reached and accepted, which is the expected number of tokens it adds, is at least the
  threshold. The threshold is the cost of one more draft relative to a target step (an MTP
  substep plus a verify row); 0.3 suits the shipped model, whose MTP layer costs roughly a
  third of a target step on a CPU.
* Limit 0 means plain decoding for that request. A slot at 0 is given one draft every
  ``adaptive_probe_interval`` rounds while other requests keep the MTP layer running (the
  probe costs one verify row), so its estimate can recover.
* When no running request wants a draft the MTP layer is skipped for the round (its cost
  is gone, not only the drafts). The proposer keeps the skipped rows and writes them into the
  MTP caches the next time it runs, so drafting resumes with a complete history. While
  skipping, every ``probe_interval`` rounds one round drafts a single token per request to
  re-measure; each probe round that does not bring drafting back doubles the interval (up to
  8 times the configured one), and any slot back above 0 resets it.

Greedy (and seeded target-match) outputs do not depend on the number of drafts, so every mode
keeps them identical to plain decoding; only the work per token changes.
"""

from __future__ import annotations

import numpy as np

from ..config import SpeculativeConfig

#: The probe interval grows up to this multiple of ``adaptive_probe_interval``.
MAX_PROBE_BACKOFF = 8


class AdaptiveDraftLength:
    """Host-side controller of per-slot draft limits (one per target runner).

    Args:
        spec: the speculative config (``num_speculative_tokens``, ``acceptance_window``,
            ``acceptance_rate_threshold``, ``adaptive_probe_interval``).
        num_slots: ``max_num_seqs``.
    """

    def __init__(self, spec: SpeculativeConfig, num_slots: int):
        self.k = int(spec.num_speculative_tokens)
        self.beta = 2.0 / (int(spec.acceptance_window) + 1)
        self.threshold = float(spec.acceptance_rate_threshold)
        self.base_interval = int(spec.adaptive_probe_interval)
        self.interval = self.base_interval
        self.p = np.ones((num_slots, self.k), np.float64)
        self.limit = np.full(num_slots, self.k, np.int64)
        self.rounds_at_zero = np.zeros(num_slots, np.int64)
        self.skipped_rounds = 0
        self.probing = False

    def reset_slot(self, idx: int) -> None:
        """A new request in slot ``idx``: optimistic estimates, full draft length."""
        self.p[idx] = 1.0
        self.limit[idx] = self.k
        self.rounds_at_zero[idx] = 0

    def _limit_of(self, b: int) -> int:
        reach = np.cumprod(self.p[b])
        ok = np.nonzero(reach >= self.threshold)[0]
        return int(ok[-1]) + 1 if ok.size else 0

    def observe(self, drafts: np.ndarray, accept_num: np.ndarray, decode_mask: np.ndarray) -> None:
        """Update the estimates from one verified step.

        Args:
            drafts: ``[N, K]`` the drafts the target checked (-1 = none).
            accept_num: ``[N]`` tokens each slot emitted (accepted drafts + 1).
            decode_mask: ``[N]`` slots that decoded (verified drafts) this step.
        """
        revived = False
        for b in np.nonzero(decode_mask)[0]:
            proposed = int((drafts[b] >= 0).sum())
            if proposed == 0:
                continue
            accepted = max(0, int(accept_num[b]) - 1)
            for i in range(min(proposed, accepted + 1)):
                hit = 1.0 if accepted > i else 0.0
                self.p[b, i] += self.beta * (hit - self.p[b, i])
            was_zero = self.limit[b] == 0
            self.limit[b] = self._limit_of(int(b))
            revived |= bool(was_zero and self.limit[b] > 0)
        if self.probing:
            self.probing = False
            if revived:
                self.interval = self.base_interval
            else:
                self.interval = min(self.interval * 2, self.base_interval * MAX_PROBE_BACKOFF)

    def plan_round(self, running: np.ndarray, prefill: bool, max_steps: int) -> tuple[int, np.ndarray]:
        """Decide the next round.

        Args:
            running: ``[N]`` slots that will decode next step.
            prefill: some slot was in prefill this step (the MTP layer must run: it has to
                see the prompt).
            max_steps: ``num_model_steps``.

        Returns:
            ``(steps, limits)``: MTP substeps to run (0 = skip the MTP layer this round) and the
            per-slot draft limit ``[N]`` int64 to apply to the proposer's drafts.
        """
        limits = self.limit.copy()
        idle = running & (limits == 0)
        self.rounds_at_zero[idle] += 1
        self.rounds_at_zero[running & (limits > 0)] = 0
        want = int(limits[running].max()) if running.any() else 0
        if want == 0 and not prefill:
            self.skipped_rounds += 1
            if self.skipped_rounds < self.interval or not running.any():
                return 0, limits
            self.probing = True  # one draft each, to re-measure
        self.skipped_rounds = 0
        # slots at 0 in a round that runs anyway: one draft every interval rounds
        probe = idle & (self.rounds_at_zero >= self.base_interval)
        limits[probe] = 1
        self.rounds_at_zero[probe] = 0
        if self.probing:
            limits[running] = np.maximum(limits[running], 1)
        steps = int(min(max_steps, max(1, limits[running].max() if running.any() else 1)))
        return steps, limits
