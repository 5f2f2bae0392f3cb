"""The adaptive draft-length rule (fastdeploy_mtp.runtime.adaptive_draft), step by step."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy_mtp.config import SpeculativeConfig, SpeculativeConfigError
from fastdeploy_mtp.runtime.adaptive_draft import MAX_PROBE_BACKOFF, AdaptiveDraftLength
from tests.support.engines import adaptive_spec


def controller(k=3, window=3, threshold=0.3, interval=4, slots=2):
    return AdaptiveDraftLength(adaptive_spec(k, window, threshold, interval), slots)


def observe(c, slot, proposed, accepted):
    k = c.k
    drafts = np.full((len(c.limit), k), -1)
    drafts[slot, :proposed] = 7
    accept_num = np.zeros(len(c.limit), np.int64)
    accept_num[slot] = accepted + 1
    mask = np.zeros(len(c.limit), bool)
    mask[slot] = True
    c.observe(drafts, accept_num, mask)


def test_starts_at_k_and_only_tested_positions_move():
    c = controller()  # beta = 0.5
    assert list(c.limit) == [3, 3]
    observe(c, 0, proposed=3, accepted=1)  # position 1 hit, position 2 miss, position 3 untested
    assert c.p[0].tolist() == [1.0, 0.5, 1.0]
    assert c.limit[0] == 3  # 1 * 0.5 * 1 >= 0.3
    observe(c, 0, proposed=3, accepted=1)
    assert c.p[0].tolist() == [1.0, 0.25, 1.0]
    assert c.limit[0] == 1  # 0.25 < 0.3 from position 2 on
    assert c.limit[1] == 3  # other slot untouched


def test_shrinks_to_zero_and_grows_back():
    c = controller()
    for _ in range(3):
        observe(c, 0, proposed=3, accepted=0)
    assert c.limit[0] == 0 and c.p[0, 0] == pytest.approx(0.125)
    observe(c, 0, proposed=1, accepted=1)  # a probe that hits
    assert c.p[0, 0] == pytest.approx(0.5625) and c.limit[0] >= 1


def test_no_slot_wants_drafts_then_plain_rounds_with_probes_and_backoff():
    c = controller(interval=2, slots=1)
    c.RELAX = 0.0  # estimates stay where the misses left them (see the next test)
    c.p[:] = 0.1
    c.limit[:] = 0
    running = np.array([True])
    plans = [c.plan_round(running, prefill=False, max_steps=3) for _ in range(2)]
    assert [p[0] for p in plans] == [0, 1]  # skipped once, then a probe round
    assert plans[1][1].tolist() == [1]  # the probe drafts one token
    observe(c, 0, proposed=1, accepted=0)  # it missed: the next probe waits twice as long
    assert c.interval == 4
    steps = [c.plan_round(running, prefill=False, max_steps=3)[0] for _ in range(4)]
    assert steps == [0, 0, 0, 1]
    for _ in range(40):
        c.plan_round(running, prefill=False, max_steps=3)
    assert c.interval == 2 * MAX_PROBE_BACKOFF
    for _ in range(3):
        observe(c, 0, proposed=1, accepted=1)  # probes that hit bring drafting back
    assert c.limit[0] >= 1 and c.interval == 2


def test_unmeasured_estimates_drift_back_to_drafting():
    c = controller(interval=1000, slots=1)  # beta = 0.5: 1/8 of the gap per idle round
    c.p[:] = 0.1
    c.limit[:] = 0
    rounds = 0
    while c.limit[0] == 0:
        c.plan_round(np.array([True]), prefill=False, max_steps=3)
        rounds += 1
    assert rounds == 2 and c.p[0, 0] == pytest.approx(
        0.1 + 0.9 * (1 - 0.875**2)
    )  # 0.1 -> 0.21 -> 0.31


def test_budget_follows_measured_cost():
    """Two slots that accept everything: with drafting twice as slow per step as its tokens
    are worth the controller settles on plain decoding, and on full drafts when it is cheap."""
    for step_cost, want in ((lambda n: 1.0 + 2.5 * n, 0), (lambda n: 1.0 + 0.1 * n, 3)):
        c = controller(interval=1000, slots=2)
        running = np.array([True, True])
        for _ in range(40):
            steps, limits = c.plan_round(running, prefill=False, max_steps=3)
            c.record(2, step_cost(c.budget), prefill=False)
        assert c.budget == want, (c.budget, c.cost_stats[:, 0])
        assert steps == min(3, want)


def test_one_slow_sample_does_not_switch_drafting_off_for_good():
    """A load spike while drafting is first measured makes plain decoding look better; probes
    from budget 0 re-measure drafting (with backoff), so the controller comes back to it."""
    c = controller(interval=4, slots=2)
    running = np.array([True, True])
    spiked = False
    budgets = []
    for _ in range(80):
        c.plan_round(running, prefill=False, max_steps=3)
        cost = 1.0 + 0.1 * c.budget
        if c.budget == 3 and c.prev_budget == 3 and not spiked:
            cost, spiked = 50.0, True  # the first clean sample of drafting: the machine was busy
        c.record(2, cost, prefill=False)
        budgets.append(c.budget)
    assert spiked and 0 in budgets[:10], "the spike must first switch drafting off"
    assert budgets[-20:].count(3) >= 15, budgets


def test_a_settled_cost_moves_a_bounded_step_on_an_outlier():
    c = controller()
    c.budget = c.prev_budget = 1
    for _ in range(10):
        c.record(2, 1.0, prefill=False)
    c.record(2, 50.0, prefill=False)  # one busy step counts as twice the estimate
    assert c.step_cost(1, 2) < 1.15
    c2 = controller()
    c2.budget = c2.prev_budget = 1
    c2.record(2, 50.0, prefill=False)  # a first sample that the next one contradicts
    c2.record(2, 1.0, prefill=False)
    assert c2.step_cost(1, 2) == pytest.approx(1.0)


def test_cost_estimate_is_a_line_in_the_batch_size():
    c = controller()
    assert c.step_cost(2, 4) is None
    c.budget = c.prev_budget = 2
    for m in (2, 4, 6, 2, 4, 6):
        c.record(m, 1.0 + 0.5 * m, prefill=False)
    assert c.step_cost(2, 8) == pytest.approx(5.0)
    c.record(8, 100.0, prefill=True)  # prefill steps are not samples
    assert c.step_cost(2, 8) == pytest.approx(5.0)
    assert c.step_cost(1, 4) is None


def test_prefill_rounds_always_run_the_mtp_layer():
    c = controller(slots=1)
    c.p[:] = 0.1
    c.limit[:] = 0
    steps, _ = c.plan_round(np.array([True]), prefill=True, max_steps=3)
    assert steps == 1


def test_reset_slot_is_optimistic():
    c = controller()
    for _ in range(4):
        observe(c, 1, proposed=3, accepted=0)
    c.reset_slot(1)
    assert c.limit[1] == 3 and (c.p[1] == 1).all()


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("acceptance_rate_threshold", 1.5, "acceptance_rate_threshold"),
        ("acceptance_window", 0, "acceptance_window"),
        ("adaptive_probe_interval", -1, "adaptive_probe_interval"),
        ("adaptive_draft_length", "yes", "adaptive_draft_length"),
        ("mtp_layer_schedule", "random", "mtp_layer_schedule"),
    ],
)
def test_config_names_the_bad_key(key, value, message):
    with pytest.raises(SpeculativeConfigError, match=message):
        SpeculativeConfig.from_dict({"method": "mtp", "num_speculative_tokens": 3, key: value})


def test_config_json_round_trip():
    spec = SpeculativeConfig.from_json(
        '{"num_speculative_tokens": 3, "adaptive_draft_length": true, '
        '"acceptance_rate_threshold": 1, "mtp_layer_schedule": "repeat_last"}'
    )
    assert spec.adaptive_draft_length is True and spec.acceptance_rate_threshold == 1.0
    assert SpeculativeConfig.from_json(spec.to_json()) == spec
