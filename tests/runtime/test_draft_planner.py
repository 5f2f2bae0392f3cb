"""The draft planner (fastdeploy_mtp.runtime.draft_planner), step by step: acceptance scored
for every method against the emitted tokens, the step-cost fit, the plan it derives."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy_mtp.config import SpeculativeConfig, SpeculativeConfigError
from fastdeploy_mtp.runtime.draft_admission import VERDICT_ADMISSIONS
from fastdeploy_mtp.runtime.draft_methods import GRAMMAR, METHODS, NO_METHOD, verified_methods
from fastdeploy_mtp.runtime.draft_planner import PLAIN, DraftPlanner, RoundPlan
from fastdeploy_mtp.runtime.draft_scoring import SCORING_SHARE, SUFFIX_SAMPLE
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.step_costs import StepCosts
from tests.support.engines import adaptive_spec

MTP, NGRAM, SUFFIX = (METHODS.index(m) for m in ("mtp", "ngram", "suffix"))
ALL = (MTP, NGRAM, SUFFIX)


def planner(k=3, steps=1, slots=2, window=3, interval=1000, methods=ALL, fill=True):
    spec = adaptive_spec(
        k, window, interval, steps=steps, mtp_strategy="with_ngram" if fill else "default"
    )
    return DraftPlanner(spec, slots, methods)


def emitted(rows):
    """accept_tokens [N, K+1], accept_num [N] of lists of emitted tokens."""
    width = max(len(r) for r in rows) + 4
    tokens = np.full((len(rows), width), -1, np.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    return tokens, np.array([len(r) for r in rows], np.int64)


def test_every_method_is_scored_against_the_emitted_tokens():
    p = planner(slots=1)  # beta = 0.5
    p.candidates = {
        MTP: np.array([[5, 6, 7]]),  # used: 5, 6 accepted, 7 rejected (target said 9)
        NGRAM: np.array([[5, 8, -1]]),  # its 8 would have been rejected at position 2
        SUFFIX: np.array([[4, 6, 7]]),  # wrong at once: positions 2, 3 untested
    }
    tokens, n = emitted([[5, 6, 9]])
    p.observe(tokens, n, np.array([True]))
    assert p.p[MTP, 0].tolist() == [1.0, 1.0, 0.5]
    assert p.p[NGRAM, 0].tolist() == [1.0, 0.5, 1.0]  # position 3: no draft, untested
    assert p.p[SUFFIX, 0].tolist() == [0.5, 1.0, 1.0]


def test_positions_past_the_emitted_tokens_are_censored_not_misses():
    p = planner(slots=1)
    p.candidates = {SUFFIX: np.array([[5, 6, 7]])}
    tokens, n = emitted([[5]])  # another method's first draft failed: one token emitted
    p.observe(tokens, n, np.array([True]))
    assert p.p[SUFFIX, 0].tolist() == [1.0, 1.0, 1.0]


def test_a_method_without_candidates_is_not_scored():
    p = planner(slots=1)
    p.p[MTP, 0] = 0.2
    p.candidates = {}  # the MTP layer was skipped
    tokens, n = emitted([[5]])
    p.observe(tokens, n, np.array([True]))
    assert p.p[MTP, 0].tolist() == [0.2, 0.2, 0.2]


def test_cost_fit_is_a_plane_in_slots_and_drafts():
    c = StepCosts(2)
    assert c.predict(1, 10, 8) is None
    for m in (9, 10, 11):  # one batch-size class (round(log2(m)) = 3)
        for d in (0, 3, 9):
            c.record(1, m, d, 1.0 + 0.5 * m + 0.1 * d)
    assert c.predict(1, 11, 20) == pytest.approx(1.0 + 5.5 + 2.0, rel=0.05)
    assert c.row_cost(1, 10) == pytest.approx(0.1, rel=0.15)  # (the ridge pulls a little)
    assert c.predict(0, 10, 0) is None


def test_one_batch_size_extrapolates_proportionally_to_the_next_class():
    c = StepCosts(2)
    for _ in range(10):
        c.record(0, 4, 0, 2.0)  # only m = 4, no drafts: 0.5 s per row
    assert c.predict(0, 8, 0) == pytest.approx(4.0, rel=0.1)  # class 3 borrows class 2's
    assert c.predict(0, 16, 0) is None  # two classes away: measured, not extrapolated


def test_a_class_keeps_its_planes_while_a_shrinking_batch_measures_others():
    c = StepCosts(2)
    for _ in range(10):
        c.record(0, 64, 0, 8.0)
    for m in (40, 20, 10, 5, 2, 1):  # the batch's requests finish
        for _ in range(5):
            c.record(0, m, 0, 0.125 * m + 0.5)
    assert c.predict(0, 64, 0) == pytest.approx(8.0, rel=0.02)
    assert c.predict(0, 2, 0) == pytest.approx(0.75, rel=0.1)


def test_a_settled_cost_moves_a_bounded_step_on_an_outlier():
    c = StepCosts(2)
    for _ in range(10):
        c.record(1, 2, 2, 1.0)
    c.record(1, 2, 2, 50.0)  # one busy step counts as twice the estimate
    assert c.predict(1, 2, 2) < 1.15
    c2 = StepCosts(2)
    c2.record(1, 2, 2, 50.0)  # a first sample that the next one contradicts
    c2.record(1, 2, 2, 1.0)
    assert c2.predict(1, 2, 2) == pytest.approx(1.0)


def drive(p, cost, rounds, accept=lambda code, slot: 1.0, rng=None):
    """Run ``rounds`` rounds of a batch whose target says ``0, 1, 2, ...`` each round: a
    method's candidate for a slot is right at each position with probability
    ``accept(code, slot)`` (else a token of its own); the target emits the chosen drafts up to
    the first wrong one, then its own token. A step costs ``cost(steps, m, drafts)``. Returns
    the plans."""
    rng = rng or np.random.default_rng(0)
    n = p.pin.shape[0]
    running = np.ones(n, bool)
    truth = np.tile(np.arange(p.k + 1), (n, 1))

    def candidates(code):
        right = rng.random((n, p.k)) < np.array([accept(code, b) for b in range(n)])[:, None]
        return np.where(right, truth[:, : p.k], 50 + code)

    plans = []
    verified = 0
    for _ in range(rounds):
        avail = {c: candidates(c) for c in (NGRAM, SUFFIX) if c in p.methods}
        plan = p.plan_round(running, False, avail)
        cands = dict(avail)
        if plan.steps > 0:
            cands[MTP] = candidates(MTP)
        rows = p.compose(plan, cands)
        p.record(n, verified, cost(plan.steps, n, verified), False)
        verified = int((rows >= 0).sum())
        lead = np.cumprod(rows == truth[:, : p.k], axis=1).sum(axis=1)
        p.observe(truth, lead + 1, running)
        plans.append(plan)
    return plans


def test_expensive_drafting_settles_on_plain_decoding():
    p = planner(slots=2, methods=(MTP,))
    plans = drive(p, lambda s, m, d: 1.0 + 3.0 * s + 1.0 * d, 40)
    assert all(pl.steps == 0 and (pl.limits == 0).all() for pl in plans[-10:])


def test_cheap_drafting_uses_every_draft():
    p = planner(slots=2, steps=3, methods=(MTP,), fill=False)
    plans = drive(p, lambda s, m, d: 1.0 + 0.05 * s + 0.01 * d, 40)
    assert sum(pl.steps == 3 and (pl.limits == 3).all() for pl in plans[-10:]) >= 8


def test_a_missing_ngram_fill_counts_as_a_miss():
    """S = 1 with the n-gram fill: whether the fill makes a draft is not known when planning,
    so an MTP round that made none past its substep scores those positions as misses; a
    model-free candidate's missing drafts are not scored (they are known when planning)."""
    p = planner(slots=1)  # beta = 0.5
    p.candidates, p.candidate_steps = (
        {MTP: np.array([[5, -1, -1]]), NGRAM: np.array([[5, -1, -1]])},
        1,
    )
    tokens, n = emitted([[5, 6, 9]])
    p.observe(tokens, n, np.array([True]))
    assert p.p[MTP, 0].tolist() == [1.0, 0.5, 1.0]  # position 3: not reached
    assert p.p[NGRAM, 0].tolist() == [1.0, 1.0, 1.0]


def test_each_request_gets_the_method_that_pays_for_it():
    """Slot 0's text repeats (suffix drafts always right, MTP's always wrong), slot 1's does
    not (MTP right, the model-free ones wrong): each gets its own."""
    p = planner(slots=2)
    good = {(SUFFIX, 0): 1.0, (MTP, 1): 1.0}
    rng = np.random.default_rng(1)
    plans = drive(
        p, lambda s, m, d: 1.0 + 0.2 * s + 0.05 * d, 60, lambda c, b: good.get((c, b), 0.0), rng=rng
    )
    last = plans[-10:]
    assert all(pl.method[0] == SUFFIX and pl.limits[0] == 3 for pl in last), last
    assert sum(pl.method[1] == MTP and pl.steps == 1 for pl in last) >= 8, last


def test_model_free_drafts_alone_skip_the_mtp_layer():
    p = planner(slots=2)
    plans = drive(p, lambda s, m, d: 1.0 + 1.0 * s + 0.05 * d, 60, lambda c, b: float(c == SUFFIX))
    assert all(pl.steps == 0 and (pl.method == SUFFIX).all() for pl in plans[-10:]), plans[-10:]


def test_a_collapsed_request_drops_to_zero_drafts_and_recovers():
    """Probes (two rounds every few) may run the other substep count; the choice is what
    most rounds run."""
    p = planner(slots=1, methods=(MTP,), interval=4)
    state = {"good": 1.0}

    def phase(rounds):
        plans = drive(
            p, lambda s, m, d: 1.0 + 0.3 * s + 0.1 * d, rounds, lambda c, b: state["good"]
        )
        return sum(int(pl.limits[0] > 0 and pl.steps == 1) for pl in plans[-10:])

    assert phase(30) >= 7
    state["good"] = 0.0
    assert phase(30) <= 3
    state["good"] = 1.0
    assert phase(80) >= 7


def test_pins_hold_a_request_to_its_method():
    p = planner(slots=3)
    p.reset_slot(0, "none")
    p.reset_slot(1, "ngram")
    plans = drive(p, lambda s, m, d: 1.0 + 0.05 * s + 0.01 * d, 20)
    assert all(pl.limits[0] == 0 and pl.method[0] == NO_METHOD for pl in plans)
    assert all(pl.method[1] in (NGRAM, NO_METHOD) for pl in plans)
    assert any(pl.method[1] == NGRAM for pl in plans)


def test_requests_admitted_while_the_mtp_layer_does_not_pay_never_see_it():
    p = planner(slots=3)
    p.reset_slot(0)
    assert not p.no_mtp[0]  # nothing measured yet: the MTP layer must see requests
    drive(p, lambda s, m, d: 1.0 + 3.0 * s + 0.05 * d, 40, lambda c, b: 1.0 if c else 0.5)
    p.reset_slot(1)
    p.reset_slot(2, "mtp")
    assert p.no_mtp[1] and not p.no_mtp[2]
    q, allowed = p._reach(np.ones(3, bool), 1, {}, np.zeros(3, np.int64))
    assert allowed[MTP].tolist() == [True, False, True]
    p.reset_slot(0, "suffix")  # a request that pins a model-free method: never the MTP layer
    assert p.no_mtp[0]


def test_a_burst_is_admitted_at_the_batch_size_it_makes():
    """Rated at 12 running slots (the MTP layer does not pay there), then idle: a burst of 12
    new requests is judged at 12, not at the 0, 1, 2, ... slots running as they arrive (far
    from 12, hence unrated: each of those would see the MTP layer and pay its prompt)."""
    p = planner(slots=12)
    drive(p, lambda s, m, d: 1.0 + 3.0 * s + 0.05 * d, 40, lambda c, b: 1.0 if c else 0.5)
    p.active[:] = False  # every request finished
    p.admit([Request(f"r{i}", [1, 2, 3], idx=i) for i in range(12)])
    assert p.no_mtp.all()
    p.active[:] = False
    for i in range(12):  # one at a time: the first ones are far from the rating
        p.reset_slot(i)
    assert not p.no_mtp[0]
    # a larger batch never rated: the MTP layer lost at the nearest smaller one, so no
    big = planner(slots=40)
    big.mtp_won = dict(p.mtp_won)
    big.admit([Request(f"b{i}", [1, 2, 3], idx=i) for i in range(40)])
    assert big.no_mtp.all()


def test_a_request_whose_cached_prefix_lacks_mtp_kv_is_admitted_without_the_mtp_layer():
    p = planner(slots=2)  # nothing rated: the MTP layer would see every request
    reqs = [Request(f"r{i}", [1, 2, 3], idx=i) for i in range(2)]
    reqs[1].prefix_without_mtp = True
    p.admit(reqs)
    assert p.no_mtp.tolist() == [False, True]


def test_a_verdict_against_the_mtp_layer_lets_one_request_in_to_measure_it_again():
    p = planner(slots=1)
    p.mtp_won = {0: False}  # batch 1: the MTP layer lost
    seen = []
    for _ in range(2 * VERDICT_ADMISSIONS):
        p.active[:] = False
        p.reset_slot(0)
        seen.append(not p.no_mtp[0])
    assert sum(seen) == 2 and seen[VERDICT_ADMISSIONS - 1] and p.mtp_won == {0: False}


def test_suffix_candidates_rotate_over_a_bounded_sample_of_the_running_slots():
    p = planner(slots=40)
    p.mode = 1  # a drafting round: an eighth of the running slots, at most SUFFIX_SAMPLE
    p.active[:16] = True
    p.last_method[18] = SUFFIX  # a slot drafting with suffix decoding: scored every round
    seen = np.zeros(40, int)
    for _ in range(8):
        want = p.wants_candidates()
        assert want[18] and want[:16].sum() == 2
        seen += want
    assert (seen[:16] == 1).all() and seen[16:18].sum() == 0
    p.active[:40] = True  # 40 running: 5 would be an eighth
    p.last_method[18] = NO_METHOD
    assert p.wants_candidates().sum() == SUFFIX_SAMPLE
    p.mode = PLAIN  # plain rounds: one suffix slot, and cheap scoring every round
    for _ in range(3):
        p.costs.record(PLAIN + 1, 40, 0, 0.010)  # a plain step of 10 ms
    assert all(p.wants_candidates().sum() == 1 for _ in range(4))
    p.scoring.note(0.0016)  # costly scoring (the average: 0.4 ms)...
    assert p.scoring.seconds == pytest.approx(0.0004)
    assert all(p.wants_candidates() is not None for _ in range(8)), "...while drafting may pay"
    p.scoring.hopeless = True  # ...is spread over rounds where drafting would not pay anyway
    every = 0.0004 / (SCORING_SHARE * 0.010)  # 4 rounds: 1% of the step time
    wants = [p.wants_candidates() for _ in range(8)]
    assert sum(w is not None for w in wants) == 8 // round(every) == 2


@pytest.mark.parametrize(("accept", "hopeless"), [(0.02, True), (0.9, False)])
def test_plain_decoding_is_hopeless_only_when_drafts_for_every_slot_would_lose(accept, hopeless):
    """n-gram drafts accepted with ``accept``, the MTP layer's never, a draft costs 0.1 of a
    plain step: a round without candidates decodes plainly either way, but only poor n-gram
    drafts make plain decoding hopeless for drafting (and its scoring sparse)."""
    p = planner(slots=2, methods=(MTP, NGRAM))
    drive(p, lambda s, m, d: 1.0 + 3.0 * s + 0.1 * d, 40, lambda c, b: accept if c else 0.0)
    plan = p.plan_round(np.ones(2, bool), False, {})  # no candidates this round: plain
    assert plan.steps == 0 and not plan.limits.any() and p.mode == PLAIN
    assert p.scoring.hopeless is hopeless


def test_forced_drafts_are_taken_even_when_drafting_does_not_pay():
    p = planner(slots=2, methods=(MTP,))
    drive(p, lambda s, m, d: 1.0 + 3.0 * s + 0.2 * d, 40, lambda c, b: 0.0)
    forced = np.array([2, 0])
    plan = p.plan_round(np.ones(2, bool), False, {}, forced)
    assert plan.limits.tolist() == [2, 0] and plan.steps == 0


def test_a_prefill_round_runs_the_mtp_layer():
    p = planner(slots=1, methods=(MTP,))
    drive(p, lambda s, m, d: 1.0 + 3.0 * s + 1.0 * d, 40)
    assert p.plan_round(np.array([True]), True, {}).steps == 1


def test_compose_takes_each_slots_method_and_cuts_at_its_limit():
    p = planner(slots=3)
    plan = RoundPlan(1, np.array([MTP, SUFFIX, NO_METHOD]), np.array([2, 3, 0]))
    rows = p.compose(plan, {MTP: np.full((3, 3), 7), SUFFIX: np.array([[1, 2, 3]] * 3)})
    assert rows.tolist() == [[7, 7, -1], [1, 2, 3], [-1, -1, -1]]
    # drafts of a slot the plan gave no method are the grammar's forced tokens
    assert verified_methods(p, "mtp", rows).tolist() == [GRAMMAR, GRAMMAR, NO_METHOD]
    p.last_method = plan.method
    assert verified_methods(p, "mtp", rows).tolist() == [MTP, SUFFIX, NO_METHOD]
    assert verified_methods(None, "ngram", rows).tolist() == [NGRAM, NGRAM, NO_METHOD]


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("acceptance_window", 0, "acceptance_window"),
        ("adaptive_probe_interval", -1, "adaptive_probe_interval"),
        ("adaptive_draft_length", "yes", "adaptive_draft_length"),
        ("acceptance_rate_threshold", 0.3, "acceptance_rate_threshold"),
    ],
)
def test_config_names_the_bad_key(key, value, message):
    with pytest.raises(SpeculativeConfigError, match=message):
        SpeculativeConfig.from_dict({"method": "mtp", "num_speculative_tokens": 3, key: value})


def test_per_request_methods_need_an_exact_verify_strategy():
    base = {"method": "mtp", "num_speculative_tokens": 3, "adaptive_draft_length": True}
    assert SpeculativeConfig.from_dict(base).per_request_methods
    assert not SpeculativeConfig.from_dict(
        {**base, "verify_strategy": "rejection"}
    ).per_request_methods
    assert not SpeculativeConfig.from_dict(
        {**base, "adaptive_draft_length": False}
    ).per_request_methods
