"""Adaptive draft length: each request drafts as many tokens as its observed acceptance pays
for, and the batch as many as the measured cost of drafting pays for, from
``num_speculative_tokens`` down to 0 (plain decoding, the MTP layer skipped) and back.

The rule (``speculative_config.adaptive_draft_length``):

* **Acceptance, per slot.** For each slot and draft position ``i = 1..K`` the controller keeps
  ``p_i``, an estimate of the probability that draft ``i`` is accepted *given* drafts
  ``1..i-1`` were: an exponential moving average with weight ``beta = 2 / (acceptance_window +
  1)``, updated only for the positions the target actually tested. A new request starts
  optimistic (``p_i = 1``). The slot's own limit is the largest ``n`` with ``p_1 * ... * p_n >=
  acceptance_rate_threshold``: below that a draft is unlikely enough to be reached and accepted
  that it is not worth a verify row. While a slot drafts nothing (its own limit or the batch
  budget is 0) its estimates drift back toward 1 by ``beta / 4`` of the gap per round, so a
  transient run of misses does not keep it from drafting for the rest of the request.
* **Cost, per batch.** Speculation pays only if the tokens it adds are worth more than the
  time the MTP substeps and the longer verify cost, and that ratio depends on the batch size
  and the machine (on a CPU a verify row costs almost as much as a plain step at batch 8, and
  almost nothing at batch 1). So the controller measures it: the wall time of every step is
  recorded against the draft budget ``n`` (0..K) the batch ran with (only steps whose verify
  and drafting both used ``n``, and no prefill), as an exponentially weighted least-squares
  line in the number of running slots. A step more than twice as slow or fast as the estimate
  is an outlier (a busy machine): against an estimate of fewer than three samples it starts
  the estimate over (the few earlier samples were more likely the outliers), against a settled
  one it counts as twice or half the estimate. Each round it picks the budget that maximises
  expected tokens per second, ``E(n) / t(n, m)``, where ``E(n) = sum over running slots of 1 +
  P(draft 1 accepted) + ... + P(drafts 1..min(n, limit) accepted)`` and ``t(n, m)`` is the
  measured step time at ``m`` running slots. Drafting must beat plain decoding by 10%
  (near-equal estimates go to plain decoding, which cannot be slower than itself), and among
  drafting budgets the one in force is kept unless another is 10% better (step times are
  noisy). The largest useful budget and 0 are tried for two rounds each when never measured (a
  cost measured at one batch size is scaled to others until they have their own samples); a
  budget in between is costed on the straight line between them until it is chosen and
  measured. Every ``adaptive_probe_interval`` rounds another budget is re-measured for two
  rounds (alternately the largest useful budget and the best other one), and each such probe
  that does not change the choice doubles the interval (up to 16 times the configured one).
  This holds at budget 0 too, where the cost of drafting would otherwise never be measured
  again: one slow sample (a busy machine) would keep plain decoding for the rest of the
  engine's life. A probe from budget 0 costs a replay of the skipped rows through the MTP
  layer, which the backoff keeps rare while plain decoding really is faster. Besides, the idle
  acceptance estimates drift back toward 1, which raises the drafting budgets' expected rates.
* **Budget 0** is plain decoding: the MTP layer is skipped for the round (a round with a
  prefill still runs it: it must see the prompt). The proposer keeps the skipped rows and
  writes them into the MTP caches the next time it runs, so drafting resumes over a complete
  history.

Greedy (and seeded target-match) outputs do not depend on the number of drafts, so every mode
keeps them identical to plain decoding; only the work per token changes.
"""

from __future__ import annotations

import numpy as np

from ..config import SpeculativeConfig

#: The probe interval grows up to this multiple of ``adaptive_probe_interval``.
MAX_PROBE_BACKOFF = 16


class AdaptiveDraftLength:
    """Host-side controller of the draft budget (one per target runner).

    Args:
        spec: the speculative config (``num_speculative_tokens``, ``acceptance_window``,
            ``acceptance_rate_threshold``, ``adaptive_probe_interval``).
        num_slots: ``max_num_seqs``.
    """

    #: weight kept by the cost statistics at each new sample (a few dozen rounds of memory)
    COST_DECAY = 0.95
    #: another budget replaces the current one only when its rate is this much better (step
    #: times are noisy; flipping between two near-equal budgets costs MTP cache replays)
    HYSTERESIS = 0.1
    #: per round without drafts, a slot's estimates move this fraction of ``beta`` toward 1
    RELAX = 0.25
    #: a step time this many times above or below a budget's estimate is an outlier: it
    #: replaces an estimate of fewer than SETTLED samples' weight (which was likely the
    #: outlier), and is clipped to that factor against a settled one
    OUTLIER = 2.0
    SETTLED = 3.0

    def __init__(self, spec: SpeculativeConfig, num_slots: int):
        self.k = int(spec.num_speculative_tokens)
        self.beta = 2.0 / (int(spec.acceptance_window) + 1)
        self.threshold = float(spec.acceptance_rate_threshold)
        self.base_interval = int(spec.adaptive_probe_interval)
        self.interval = self.base_interval
        self.p = np.ones((num_slots, self.k), np.float64)
        self.limit = np.full(num_slots, self.k, np.int64)
        #: per budget n: decayed sums of (1, m, m^2, t, m t) over recorded steps
        self.cost_stats = np.zeros((self.k + 1, 5), np.float64)
        self.budget = self.k  # the budget of the round being planned / run
        self.prev_budget = -1  # the budget whose drafts this step verified
        self.pinned = 0  # rounds left at the budget being measured
        self.rounds_since_probe = 0
        self.probes = 0  # probes started (they alternate between two targets)
        self.probe_from: int | None = None  # the choice a running probe may overturn
        self.rounds_at_zero = np.zeros(num_slots, np.int64)
        self.force_probe = False  # every running slot drafts one token this round

    # ---- acceptance --------------------------------------------------------------------
    def reset_slot(self, idx: int) -> None:
        """A new request in slot ``idx``: optimistic estimates, full draft length."""
        self.p[idx] = 1.0
        self.limit[idx] = self.k
        self.rounds_at_zero[idx] = 0

    def _limits(self, rows: np.ndarray) -> np.ndarray:
        """Own draft limits of the slots ``rows`` selects: the longest prefix of positions whose
        chance of being reached and accepted is at least the threshold."""
        reach = np.cumprod(self.p[rows], axis=1)
        return (reach >= self.threshold).sum(axis=1)  # reach only falls along a row

    def observe(self, drafts: np.ndarray, accept_num: np.ndarray, decode_mask: np.ndarray) -> None:
        """Update the acceptance estimates from one verified step.

        Args:
            drafts: ``[N, K]`` the drafts the target checked (-1 = none).
            accept_num: ``[N]`` tokens each slot emitted (accepted drafts + 1).
            decode_mask: ``[N]`` slots that decoded (verified drafts) this step.
        """
        proposed = (np.asarray(drafts)[:, : self.k] >= 0).sum(axis=1)
        rows = np.asarray(decode_mask, bool) & (proposed > 0)
        if not rows.any():
            return
        accepted = np.maximum(np.asarray(accept_num, np.int64) - 1, 0)
        pos = np.arange(self.k)[None, :]
        # position i was tested iff i < proposed and drafts 1..i were accepted (i <= accepted)
        tested = rows[:, None] & (pos < proposed[:, None]) & (pos <= accepted[:, None])
        hit = (pos < accepted[:, None]).astype(np.float64)
        self.p += np.where(tested, self.beta * (hit - self.p), 0.0)
        was_zero = rows & (self.limit == 0)
        self.limit[rows] = self._limits(rows)
        if (was_zero & (self.limit > 0)).any():
            self.interval = self.base_interval  # a slot came back: probe often again

    def _gains(self, running: np.ndarray) -> np.ndarray:
        """``[K + 1]`` expected tokens of the running slots for every budget 0..K."""
        reach = np.cumprod(self.p[running], axis=1)
        reach = np.where(np.arange(self.k)[None, :] < self.limit[running][:, None], reach, 0.0)
        return float(running.sum()) + np.concatenate([[0.0], np.cumsum(reach.sum(axis=0))])

    # ---- cost ----------------------------------------------------------------------------
    def record(self, running_slots: int, seconds: float, prefill: bool) -> None:
        """The wall time of the step that just ran (its verify used the previous round's
        budget, its proposer round the current one): a sample of the budget's cost when both
        are the same and no slot was in prefill."""
        if not prefill and running_slots > 0 and self.prev_budget == self.budget:
            m = float(running_slots)
            st = self.cost_stats[self.budget]
            estimate = self.step_cost(self.budget, running_slots)
            if (
                estimate is not None
                and not estimate / self.OUTLIER <= seconds <= estimate * self.OUTLIER
            ):
                if st[0] < self.SETTLED:
                    st[:] = 0.0  # a sample or two that this one contradicts: start over from it
                else:  # a settled estimate: one outlier (a busy machine) moves it a bounded step
                    seconds = min(max(seconds, estimate / self.OUTLIER), estimate * self.OUTLIER)
            st *= self.COST_DECAY
            st += (1.0, m, m * m, seconds, m * seconds)
        self.prev_budget = self.budget

    def step_cost(self, budget: int, m: int) -> float | None:
        """Estimated seconds of a step at ``m`` running slots with ``budget`` drafts, or None
        when the budget was never measured."""
        w, sm, smm, st, smt = self.cost_stats[budget]
        if w < 0.5:
            return None
        mean_m, mean_t = sm / w, st / w
        var = smm / w - mean_m * mean_m
        if var < 0.25:
            # essentially one batch size so far: scale it with the batch size. Every budget
            # measured at that size scales alike, so their comparison keeps what was measured
            # (the absolute figure is rough; a fresh size gets its own samples as it runs)
            return mean_t * m / mean_m
        slope = (smt / w - mean_m * mean_t) / var
        return max(mean_t + slope * (m - mean_m), 1e-6)

    def _cost_or_interpolated(self, n: int, top: int, m: int) -> float | None:
        """:meth:`step_cost`, or for a budget not measured yet a straight line between the
        measured costs of 0 and ``top`` drafts (the extremes are explored first; the middle
        is measured when it gets chosen)."""
        cost = self.step_cost(n, m)
        if cost is not None or n in (0, top):
            return cost
        lo, hi = self.step_cost(0, m), self.step_cost(top, m)
        if lo is None or hi is None:
            return None
        return lo + (hi - lo) * n / top

    # ---- the round's plan ----------------------------------------------------------------
    def plan_round(
        self, running: np.ndarray, prefill: bool, max_steps: int
    ) -> tuple[int, np.ndarray]:
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
        m = int(running.sum())
        idle = running & (self.limit == 0)
        self.rounds_at_zero[idle] += 1
        self.rounds_at_zero[running & (self.limit > 0)] = 0
        self.budget = self._choose(running, m) if m else self.k
        limits = np.minimum(self.limit, self.budget)
        if self.budget >= 1:
            # a slot at 0 drafts one token now and then, so its estimate can recover
            probe = idle & ((self.rounds_at_zero >= self.base_interval) | self.force_probe)
            limits[probe] = 1
            self.rounds_at_zero[probe] = 0
        self.force_probe = False
        # estimates nobody is measuring drift back toward the optimistic prior (1), so a slot
        # held back by a transient miss or by the batch budget gets drafts again and is re-measured
        idle_now = running & (limits == 0)
        if idle_now.any():
            self.p[idle_now] += self.RELAX * self.beta * (1.0 - self.p[idle_now])
            self.limit[idle_now] = self._limits(idle_now)
        want = int(limits[running].max()) if m else 0
        steps = min(max_steps, want)
        if prefill:
            steps = max(steps, 1)
        return steps, limits

    def _choose(self, running: np.ndarray, m: int) -> int:
        if self.pinned > 0:  # finish measuring the budget picked last round
            self.pinned -= 1
            return self.budget
        gains = self._gains(running)
        # budgets that add nothing over a smaller one (every slot is limited below) are out
        useful = [n for n in range(self.k + 1) if n == 0 or gains[n] > gains[n - 1] + 1e-9]
        if useful == [0]:  # no slot wants a draft: plain decoding, with a probe now and then
            self.rounds_since_probe += 1
            if self.rounds_since_probe < self.interval:
                return 0
            self.rounds_since_probe = 0
            self.interval = min(2 * self.interval, MAX_PROBE_BACKOFF * self.base_interval)
            self.force_probe = True
            return 1
        top = useful[-1]
        if top != 0 and self.step_cost(top, m) is None:
            return self._measure(top)
        if self.step_cost(0, m) is None and len(useful) > 1:
            return self._measure(0)
        rates = {
            n: gains[n] / c
            for n in useful
            if (c := self._cost_or_interpolated(n, top, m)) is not None
        }
        if not rates:
            return 0
        best = max(rates, key=lambda n: rates[n])
        # among drafting budgets, the one in force (before a probe that just ran, if one did)
        # stays unless clearly beaten
        current = self.probe_from if self.probe_from is not None else self.budget
        if (
            best != 0
            and current != 0
            and current in rates
            and rates[best] <= rates[current] * (1 + self.HYSTERESIS)
        ):
            best = current
        # drafting must clearly beat plain decoding: near-equal estimates go to plain decoding,
        # which cannot be slower than itself
        if best != 0 and 0 in rates and rates[best] < rates[0] * (1.0 + self.HYSTERESIS):
            best = 0
        if self.probe_from is not None:  # a probe just finished: did it change the choice?
            self.interval = (
                self.base_interval
                if best != self.probe_from
                else min(2 * self.interval, MAX_PROBE_BACKOFF * self.base_interval)
            )
            self.probe_from = None
        self.rounds_since_probe += 1
        # re-measure the runner-up now and then, also from budget 0: a cost is only ever
        # updated by running it, and one noisy sample must not settle the choice for good
        if self.rounds_since_probe >= self.interval and len(rates) > 1:
            self.rounds_since_probe = 0
            self.probe_from = best
            self.probes += 1
            # every other probe re-measures the largest useful budget (the budgets between 0
            # and it are costed on the line to it until measured, so a stale sample there
            # misprices them all); the others the runner-up
            if self.probes % 2 and top != best:
                return self._measure(top)
            return self._measure(max((n for n in rates if n != best), key=lambda n: rates[n]))
        return best

    def _measure(self, budget: int) -> int:
        """Run ``budget`` for two rounds: the second one's step is a clean sample. The budget
        in force before stays the one to beat (by the hysteresis margin) afterwards."""
        if self.probe_from is None:
            self.probe_from = self.budget
        self.pinned = 1
        return budget
