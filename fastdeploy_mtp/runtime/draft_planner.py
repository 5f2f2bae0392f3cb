"""The draft planner (``speculative_config.adaptive_draft_length``): before each round it
decides, for every running request, which method drafts for it (the MTP layer as configured,
n-gram matching, suffix decoding) and how many drafts it gets (0 included), and the round's
*mode*: plain decoding (:data:`PLAIN`: no drafts, the MTP layer skipped), model-free drafts only
(0 MTP substeps) or ``S`` MTP substeps, maximising the batch's expected tokens per second.

* Acceptance: per slot, method and position, ``p_d[j]`` = P(draft ``j`` accepted | drafts
  ``1..j-1`` were), an exponential moving average (weight ``2 / (acceptance_window + 1)``) a new
  request starts from the average over all requests. Every method's candidates are scored
  against the emitted tokens after each verification, the unused methods' too (for greedy and
  seeded requests those are the target's own choices up to where the used drafts failed); the
  MTP layer only in rounds that run it, a missing n-gram fill of its counting as a miss.
* Cost: the step time per mode and class of batch sizes, a plane in running slots and
  verified drafts (:class:`~.step_costs.StepCosts`) from steps without a prefill that ran the
  mode twice; a drafting mode never costs less than plain decoding plus its drafts.
* Plan: a draft is taken when ``q = p[1] ... p[j]`` exceeds the fitted cost of a draft times
  the batch's rate (Dinkelbach's iteration, three times); each slot takes the method with the
  best net gain; grammar-forced drafts are certain. The best mode wins, kept unless another is
  10% better; drafting must beat plain decoding by 10%. Unmeasured modes run two rounds first,
  the runner-up is re-measured every ``adaptive_probe_interval`` rounds (doubling, up to 16x,
  while probes change nothing). A request admitted where the MTP layer was measured not to
  pay is one it never sees (no prompt forward; model-free drafts only): :meth:`_mtp_pays`.

A request may pin its method (``speculative_method``; ``"none"``: no drafts). Outputs do not
depend on any of this (greedy and seeded ``target_match``). The full rule and its reasons:
``docs/architecture.md``, "the draft planner".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import SpeculativeConfig
from .collaborators import Proposer
from .draft_admission import Admission
from .draft_methods import METHODS, NO_METHOD
from .draft_scoring import ScoringCadence
from .step_costs import StepCosts

MTP, SUFFIX = METHODS.index("mtp"), METHODS.index("suffix")

#: The mode of a round without drafts (plain decoding: the MTP layer skipped, no drafts); a
#: drafting round's mode is its number of MTP substeps (0: model-free drafts only).
PLAIN = -1
#: The probe interval grows up to this multiple of ``adaptive_probe_interval``.
MAX_PROBE_BACKOFF = 16


@dataclass
class RoundPlan:
    """One round's decision.

    Attributes:
        steps: MTP substeps to run (0 = the MTP layer is skipped).
        method: ``[N]`` int64 method code of each slot's drafts (:data:`NO_METHOD`: none).
        limits: ``[N]`` int64 drafts each slot gets at most.
    """

    steps: int
    method: np.ndarray
    limits: np.ndarray


class DraftPlanner(Admission):
    """Host-side planner of each round's drafts (one per target runner).

    Args:
        spec: the speculative config (``num_speculative_tokens``, ``num_model_steps``,
            ``mtp_strategy``, ``acceptance_window``, ``adaptive_probe_interval``).
        num_slots: ``max_num_seqs``.
        methods: the codes of :data:`METHODS` a request may be given here (the MTP layer
            always; the model-free ones where the proposer computes their candidates).
    """

    #: Dinkelbach iterations of the allocation (rate -> bar -> drafts -> rate)
    ITERATIONS = 3

    def __init__(self, spec: SpeculativeConfig, num_slots: int, methods: tuple[int, ...]):
        super().__init__(
            int(spec.num_speculative_tokens),
            num_slots,
            int(spec.acceptance_window),
            methods,
            spec.mtp_strategy == "with_ngram",  # past its substeps the MTP method fills to K
        )
        self.max_steps = int(spec.num_model_steps)
        self.base_interval = int(spec.adaptive_probe_interval)
        self.interval = self.base_interval
        #: step costs per mode (PLAIN, then 0..max_steps substeps), at index mode + 1
        self.costs = StepCosts(self.max_steps + 2)
        self.mode = self.max_steps  # the mode of the round being planned / run
        self.prev_mode: int | None = None  # the mode of the round this step verified
        self.hold = 0  # rounds left at the mode being measured
        self.rounds_since_probe = 0
        self.probe_from: int | None = None
        self.free_methods = tuple(c for c in self.methods if c != MTP)  #: model-free codes
        #: when the model-free candidates are computed, and for which slots
        self.scoring = ScoringCadence()
        #: ``[N]`` method code of the drafts each slot got in the last round
        self.last_method = np.full(num_slots, NO_METHOD, np.int64)

    @classmethod
    def of_proposer(
        cls, spec: SpeculativeConfig, num_slots: int, proposer: Proposer | None
    ) -> DraftPlanner | None:
        """The planner of a runner whose proposer is ``proposer`` (None without
        ``adaptive_draft_length``), sharing :attr:`no_mtp` with it as its excluded slots."""
        if proposer is None or not spec.adaptive_draft_length:
            return None
        alternatives = proposer.alternatives
        planner = cls(spec, num_slots, (MTP, *(alternatives.codes if alternatives else ())))
        proposer.excluded = planner.no_mtp
        return planner

    @property
    def steps(self) -> int:
        """MTP substeps of the round being planned / run (0 in the modes without them)."""
        return max(self.mode, 0)

    def record(self, running_slots: int, drafts: int, seconds: float, prefill: bool) -> None:
        """The wall time of the step that just ran (its verify checked ``drafts`` drafts of
        the previous round, its proposer round ran this round's): a cost sample of the mode
        when both rounds ran the same one and no slot was in prefill."""
        if not prefill and running_slots > 0 and self.prev_mode == self.mode:
            self.costs.record(self.mode + 1, running_slots, drafts, seconds)
        self.prev_mode = self.mode

    # ---- the plan ---------------------------------------------------------------------------
    def wants_candidates(self) -> np.ndarray | None:
        """``[N]`` bool: the slots the next round needs suffix candidates of (n-gram
        candidates, one op for the batch, come for every slot); None: no candidates this
        round (:class:`~.draft_scoring.ScoringCadence`)."""
        plain = self.mode == PLAIN and self.hold == 0
        step = self._cost(PLAIN, max(int(self.active.sum()), 1), 0.0) if plain else None
        used = (self.last_method == SUFFIX) | (self.pin == SUFFIX)
        return self.scoring.wants(self.active, used, plain, step)

    def _cost(self, mode: int, m: int, d: float) -> float | None:
        """:meth:`StepCosts.predict` of ``mode``, or for a substep count between 1 and the
        most, never measured, the straight line between 0 substeps (or plain decoding) and
        the most. A drafting mode never costs less than plain decoding at the same batch size
        plus its drafts at the fitted cost of one: its plane, fitted where the drafts grow
        with the batch, cannot tell the two apart and may extrapolate below plain decoding."""
        cost = self.costs.predict(mode + 1, m, d)
        if cost is None and mode not in (PLAIN, 0, self.max_steps):
            lo = self.costs.predict(1, m, d) or self.costs.predict(0, m, d)
            hi = self.costs.predict(self.max_steps + 1, m, d)
            if lo is not None and hi is not None:
                cost = lo + (hi - lo) * mode / self.max_steps
        plain = self.costs.predict(PLAIN + 1, m, 0.0)
        if cost is None or mode == PLAIN or plain is None:
            return cost
        return max(cost, plain + self._row_cost(mode, m) * d)

    def _row_cost(self, mode: int, m: int) -> float:
        """The fitted cost of one more draft in ``mode`` at ``m`` slots (for an unmeasured
        substep count between 1 and the most, the most's)."""
        if self.costs.fit_of(mode + 1, m) is None and mode not in (0, self.max_steps):
            mode = self.max_steps
        return self.costs.row_cost(mode + 1, m)

    def _reach(
        self,
        running: np.ndarray,
        steps: int,
        available: dict[int, np.ndarray],
        forced: np.ndarray,
        all_seen: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``q`` ``[M, R, K]`` (M = len(METHODS), R running slots): each method's chance that
        draft ``j`` is reached and accepted, 0 where it has none and at the positions the
        grammar forces (those are taken anyway); and ``allowed`` ``[M, R]`` (``all_seen``: as
        if the MTP layer saw every request)."""
        idx = np.nonzero(running)[0]
        q = np.cumprod(self.p[:, idx], axis=2)
        pos = np.arange(self.k)[None, :]
        allowed = np.zeros((len(METHODS), idx.size), bool)
        for code in self.methods:
            if code == MTP:  # (a missing n-gram fill is scored as a miss: see observe)
                has = np.broadcast_to(pos < (self.k if self.mtp_fill else steps), q[code].shape)
                ok = steps > 0
            elif code in available:
                has = available[code][idx] >= 0
                ok = True
            else:  # no candidates this round
                has, ok = np.zeros(q[code].shape, bool), False
            q[code] = np.where(has, q[code], 0.0)
            allowed[code] = ok & ((self.pin[idx] == self.FREE) | (self.pin[idx] == code))
        if not all_seen:
            allowed[MTP] &= ~self.no_mtp[idx]
        q = np.where((pos < forced[idx][:, None])[None], 0.0, q)
        return q, allowed

    def _allocate(
        self, q: np.ndarray, allowed: np.ndarray, forced: np.ndarray, steps: int, m: int
    ) -> tuple[float, np.ndarray, np.ndarray] | None:
        """The best allocation under ``steps`` substeps: ``(rate, method [R], drafts [R])``,
        or None when the substep count has no cost estimate yet. ``forced`` ``[R]``: drafts
        the grammar forces (certain gains, always taken)."""
        d = float(forced.sum())
        t0 = self._cost(steps, m, d)
        if t0 is None:
            return None
        rate = (m + d) / t0
        method = np.full(q.shape[1], NO_METHOD, np.int64)
        count = forced.copy()
        cols = np.arange(q.shape[1])
        row = self._row_cost(steps, m)
        for _ in range(self.ITERATIONS):
            bar = row * rate
            take = q > bar
            net = np.where(allowed, np.where(take, q - bar, 0.0).sum(axis=2), 0.0)
            best = net.argmax(axis=0)
            has = net[best, cols] > 0.0
            method = np.where(has, best, NO_METHOD)
            count = forced + np.where(has, take[best, cols].sum(axis=1), 0)
            gain = np.where(has, np.where(take, q, 0.0)[best, cols].sum(axis=1), 0.0)
            d = float(count.sum())
            cost = self._cost(steps, m, d)
            assert cost is not None
            rate = (m + float(forced.sum()) + float(gain.sum())) / cost
        return rate, method, count

    def plan_round(
        self,
        running: np.ndarray,
        prefill: bool,
        available: dict[int, np.ndarray],
        forced: np.ndarray | None = None,
    ) -> RoundPlan:
        """Decide the next round.

        Args:
            running: ``[N]`` slots that will decode next step.
            prefill: a slot the MTP layer sees was in prefill this step (the MTP layer must
                run: it has to see the prompt).
            available: the model-free methods' candidate drafts ``[N, K]`` (-1 = none) by
                method code, computed for this round.
            forced: ``[N]`` leading drafts the grammar forces per slot (None: none).
        """
        n_slots = running.shape[0]
        self.active[:] = running
        forced = np.zeros(n_slots, np.int64) if forced is None else forced
        method = np.full(n_slots, NO_METHOD, np.int64)
        limits = forced * running
        m = int(running.sum())
        if m == 0:
            self.mode = self.max_steps if prefill else PLAIN
        elif self._stays_plain(prefill, available, forced):
            self.rounds_since_probe += 1
        else:
            self.scoring.note_available(available, running)
            self.mode = self._plan_modes(running, prefill, available, forced, method, limits)
        self.last_method = method
        return RoundPlan(self.steps, method, limits)

    def _drafting_hopeless(
        self,
        running: np.ndarray,
        forced: np.ndarray,
        plain: tuple[float, np.ndarray, np.ndarray] | None,
    ) -> bool:
        """Plain decoding was chosen: whether model-free drafting would still not win (by the
        margin a switch needs) if the slots had candidates as often as they recently did;
        then candidates are scored sparingly."""
        if plain is None or not self.free_methods:
            return True
        everywhere = {c: np.zeros((running.shape[0], self.k), np.int64) for c in self.free_methods}
        q, allowed = self._reach(running, 0, everywhere, forced)
        for code in self.free_methods:
            q[code] *= self.scoring.available.get(code, 1.0)
        best = self._allocate(q, allowed, forced[running], 0, int(running.sum()))
        return best is None or best[0] < plain[0] * (1.0 + self.HYSTERESIS)

    def _stays_plain(
        self, prefill: bool, available: dict[int, np.ndarray], forced: np.ndarray
    ) -> bool:
        """Plain decoding holds without a new decision: it did last round, no candidates
        were computed this round (nothing could beat it), nothing is forced, no probe is due,
        and the MTP layer need not see a prompt."""
        idle = not (prefill or available or forced.any() or self.hold)
        due = self.probe_from is not None or self.rounds_since_probe + 1 >= self.interval
        return idle and not due and self.mode == PLAIN

    def _plan_modes(
        self,
        running: np.ndarray,
        prefill: bool,
        available: dict[int, np.ndarray],
        forced: np.ndarray,
        method: np.ndarray,
        limits: np.ndarray,
    ) -> int:
        """Every mode's best allocation, the chosen mode (:meth:`_choose`); its allocation
        into ``method`` and ``limits`` (``[N]``, in place)."""
        m = int(running.sum())
        # the MTP modes need a request the MTP layer sees, and a prefill round of such a
        # request runs the MTP layer (it has to see the prompt)
        modes = list(range(1, self.max_steps + 1)) if (running & ~self.no_mtp).any() else []
        if not (prefill and modes):
            modes = [PLAIN, *([0] if self.free_methods else []), *modes]
        plans: dict[int, tuple[float, np.ndarray, np.ndarray] | None] = {}
        as_if_seen: dict[int, float] = {}  # the verdict's rates (Admission.note_rates)
        for mode in modes:
            if mode == PLAIN:
                d = float(forced[running].sum())
                cost = self._cost(PLAIN, m, d)
                none = np.full(m, NO_METHOD, np.int64)
                plans[PLAIN] = None if cost is None else ((m + d) / cost, none, forced[running])
                continue
            q, allowed = self._reach(running, mode, available, forced)
            plans[mode] = self._allocate(q, allowed, forced[running], mode, m)
            if mode >= 1 and (running & self.no_mtp).any():
                q, allowed = self._reach(running, mode, available, forced, all_seen=True)
                seen = self._allocate(q, allowed, forced[running], mode, m)
                if seen is not None:
                    as_if_seen[mode] = seen[0]
        mode = self._choose(plans, prefill, as_if_seen)
        chosen = plans[mode]
        if mode == PLAIN:
            self.scoring.hopeless = self._drafting_hopeless(running, forced, plans[PLAIN])
            return PLAIN
        if chosen is not None:
            method[running], limits[running] = chosen[1], chosen[2]
        elif not prefill:  # a mode being measured for the first time: every draft it has (a
            # prefill round cannot measure it, its step is no sample: no drafts then)
            q, allowed = self._reach(running, mode, available, forced)
            net = np.where(allowed, q.sum(axis=2), 0.0)
            has = net.max(axis=0) > 0.0
            method[running] = np.where(has, net.argmax(axis=0), NO_METHOD)
            limits[running] = np.where(has, self.k, forced[running])
        return mode

    def _choose(
        self,
        plans: dict[int, tuple[float, np.ndarray, np.ndarray] | None],
        prefill: bool,
        as_if_seen: dict[int, float],
    ) -> int:
        """The round's mode (module docstring: measure, compare, keep, probe); ``as_if_seen``:
        MTP modes' rates for the verdict (``Admission.note_rates``)."""
        if self.hold > 0 and self.mode in plans:
            self.hold -= 1
            return self.mode
        for mode in (self.max_steps, PLAIN, 0):
            if mode in plans and plans[mode] is None:
                return self._measure(mode)
        rates = {s: plan[0] for s, plan in plans.items() if plan is not None}
        if not rates:  # (only modes costed from others not measured yet)
            return self._measure(max(plans))
        self.note_rates(rates, as_if_seen)
        best = max(rates, key=lambda s: rates[s])
        current = self.probe_from if self.probe_from is not None else self.mode
        # among drafting modes the one in force stays unless clearly beaten
        if (
            PLAIN not in (best, current)
            and current in rates
            and rates[best] <= rates[current] * (1.0 + self.HYSTERESIS)
        ):
            best = current
        # drafting must clearly beat plain decoding, which cannot be slower than itself
        if (
            best != PLAIN
            and PLAIN in rates
            and rates[best] < rates[PLAIN] * (1.0 + self.HYSTERESIS)
        ):
            best = PLAIN
        if self.probe_from is not None:  # a probe just finished: did it change the choice?
            grown = min(2 * self.interval, MAX_PROBE_BACKOFF * self.base_interval)
            self.interval = self.base_interval if best != self.probe_from else grown
            self.probe_from = None
        self.rounds_since_probe += 1
        if self.rounds_since_probe >= self.interval and len(rates) > 1 and not prefill:
            self.rounds_since_probe = 0
            self.probe_from = best
            return self._measure(max((s for s in rates if s != best), key=lambda s: rates[s]))
        return best

    def _measure(self, mode: int) -> int:
        """Run ``mode`` for two rounds: the second one's step is a clean sample."""
        if self.probe_from is None:
            self.probe_from = self.mode
        self.hold = 1
        return mode

    def compose(self, plan: RoundPlan, candidates: dict[int, np.ndarray]) -> np.ndarray:
        """``[N, K]`` int64 drafts of the round: each slot's row of its method's candidates
        (``candidates`` by code, the MTP layer's included when it ran), cut at its limit; -1
        where none. The candidates become what the next :meth:`observe` scores."""
        self.candidates, self.candidate_steps = candidates, plan.steps
        out = np.full((plan.method.shape[0], self.k), -1, np.int64)
        pos = np.arange(self.k)[None, :]
        for code, rows in candidates.items():
            sel = plan.method == code
            if sel.any():
                keep = pos < plan.limits[sel][:, None]
                out[sel] = np.where(keep, rows[sel, : self.k], -1)
        return out
