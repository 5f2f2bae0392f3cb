"""verify_draft_tokens on every backend against tests/reference/ (docs/ops.md).

Tensors are passed in the op's order (18, optional ones may be None), then the attrs
(max_seq_len, verify_window, verify_strategy, reject_all, accept_all, keep_max_dec_len_token)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastdeploy_mtp.ops.sampling import (
    _philox4x32_10,
    position_uniforms,
    rejection_candidates,
    topp_uniforms,
)
from tests.reference.verify_draft_tokens import NAMES, verify_draft_tokens as reference
from tests.support.compare import assert_exact, assert_rejected
from tests.support.op_states import (
    EOS,
    GREEDY,
    REJECTION,
    SENTINEL,
    TARGET_MATCH,
    TOPP,
    verify_state as make_state,
)

OP = "verify_draft_tokens"


def attrs(strategy, reject_all=False, accept_all=False, keep=False):
    return (4096, 2, strategy, reject_all, accept_all, keep)


def check(backend, tensors, at, context):
    want = reference(tensors, at)
    got = backend.run(OP, tensors, at)
    for name, g in zip(NAMES, got):
        if g is None:
            assert want[name] is None
            continue
        assert_exact(name, g, want[name], context=f"{backend.name}, {context}")
    return dict(zip(NAMES, got))


STRATEGIES = {"topp": TOPP, "greedy": GREEDY, "target_match": TARGET_MATCH, "rejection": REJECTION}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
def test_random_states_match_reference(backend, bsz, k, strategy):
    s = STRATEGIES[strategy]
    rng = np.random.default_rng(hash((bsz, k, s)) % 2**32)
    real = bsz if bsz < 7 else bsz - 3  # padding slots past real_bsz
    check(
        backend, make_state(rng, bsz, k, s, real_bsz=real), attrs(s), f"bsz={bsz} k={k} {strategy}"
    )


@pytest.mark.parametrize(
    "flags", [(True, False), (False, True), (True, True)], ids=["reject_all", "accept_all", "both"]
)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_random_states_with_flags_match_reference(backend, strategy, flags):
    s = STRATEGIES[strategy]
    rng = np.random.default_rng(77 + s)
    got = check(backend, make_state(rng, 64, 4, s), attrs(s, *flags), f"{strategy} flags={flags}")
    if flags[0]:  # reject_all (beats accept_all): at most one token per item
        assert got["step_output_len"].max() <= 1


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("k", [1, 5, 8])
def test_random_states_keeping_the_max_dec_len_token_match_reference(backend, strategy, k):
    """``keep_max_dec_len_token``: every item's ``max_dec_len`` is 1 or 2 tokens away,
    so many reach it; the same counts as upstream's, and the last token is the strategy's."""
    s = STRATEGIES[strategy]
    rng = np.random.default_rng(91 + 7 * s + k)
    tensors = make_state(rng, 64, k, s)
    tensors[15] = tensors[16] + rng.integers(1, 3, (64, 1))
    got = check(backend, tensors, attrs(s, keep=True), f"{strategy} k={k} keep")
    upstream = reference(tensors, attrs(s))
    n, step, limit = got["step_output_len"], tensors[16].reshape(-1), tensors[15].reshape(-1)
    reached = (n > 0) & (step + n >= limit)
    assert reached.sum() >= 5, "the batch must have items reaching max_dec_len"
    changed = 0
    for b in np.nonzero(reached)[0]:
        last = int(got["step_output_ids"][b, n[b] - 1])
        want = int(upstream["step_output_ids"][b, n[b] - 1])
        assert n[b] == upstream["step_output_len"][b]
        assert want in EOS  # upstream: the end id (or an EOS the strategy chose)
        changed += last != want
    assert changed > 0, "keeping the token must change some item's last token"


# ---- hand-made single-item cases -------------------------------------------------------


def one_item(
    strategy,
    drafts,
    *,
    slt=None,
    enc=0,
    step=0,
    max_dec=100,
    reasoning=0,
    target=None,
    ids=None,
    scores=None,
    lens=None,
    uniforms=None,
    topp=1.0,
    stop=False,
    paused=False,
    w=None,
):
    w = w or len(drafts) + 1
    inp = np.full((1, w), 0, np.int64)
    inp[0, 0] = 1
    inp[0, 1 : 1 + len(drafts)] = drafts
    slt = len(drafts) + 1 if slt is None else slt
    rows = 1 if enc or slt == 1 else slt
    tensors = [
        np.full((1, w), SENTINEL, np.int64),
        np.full((1,), SENTINEL, np.int32),
        inp,
        None if target is None else np.array(target, np.int64),
        None if ids is None else np.array(ids, np.int64).reshape(rows, -1),
        None if scores is None else np.array(scores, np.float32).reshape(rows, -1),
        None if lens is None else np.array(lens, np.int32),
        np.full((1, 1), topp, np.float32),
        np.array([[stop]]),
        np.array([enc], np.int32),
        np.array([slt], np.int32),
        np.array(EOS, np.int64).reshape(-1, 1),
        np.array([paused]),
        np.zeros(1, np.int32),
        np.array([[reasoning]], np.int32),
        np.array([[max_dec]], np.int64),
        np.array([[step]], np.int64),
        None if uniforms is None else np.array(uniforms, np.float32).reshape(rows, 2),
    ]
    return tensors


def run_one(backend, tensors, strategy, **flags):
    got = check(backend, tensors, attrs(strategy, **flags), "single item")
    n = int(got["step_output_len"][0])
    return list(got["step_output_ids"][0, :n]), got["step_output_ids"][0]


def test_greedy_accepts_prefix_then_emits_target_at_first_mismatch(backend):
    toks, row = run_one(backend, one_item(GREEDY, [7, 8, 9], target=[7, 5, 9, 4]), GREEDY)
    assert toks == [7, 5] and list(row[2:]) == [-1, -1]


def test_greedy_all_accepted_bonus_comes_from_the_last_row(backend):
    toks, _ = run_one(backend, one_item(GREEDY, [7, 8], target=[7, 8, 6]), GREEDY)
    assert toks == [7, 8, 6]


def test_eos_draft_accepted_stops_without_a_bonus_token(backend):
    toks, _ = run_one(backend, one_item(GREEDY, [7, 2, 9], target=[7, 2, 9, 4]), GREEDY)
    assert toks == [7, 2]


def test_max_dec_len_mid_run_replaces_with_end_token(backend):
    # upstream's example: step_idx 48, max_dec_len 50, two accepted drafts -> n = 2
    toks, _ = run_one(
        backend, one_item(GREEDY, [7, 8, 9], step=48, max_dec=50, target=[7, 8, 9, 4]), GREEDY
    )
    assert toks == [7, EOS[0]]


def test_max_dec_len_token_is_kept_when_asked_and_the_item_still_stops(backend):
    # the same state: the token at step 50 is the accepted draft 8, Phase 1 stops there
    toks, row = run_one(
        backend,
        one_item(GREEDY, [7, 8, 9], step=48, max_dec=50, target=[7, 8, 9, 4]),
        GREEDY,
        keep=True,
    )
    assert toks == [7, 8] and list(row[2:]) == [-1, -1]
    # the final (Phase 2) token reaching the limit: the target's 6, not the end id
    toks, _ = run_one(
        backend, one_item(GREEDY, [7, 8], step=7, max_dec=10, target=[7, 8, 6]), GREEDY, keep=True
    )
    assert toks == [7, 8, 6]
    # an EOS id stays an EOS id
    toks, _ = run_one(
        backend, one_item(GREEDY, [7], step=8, max_dec=10, target=[7, 3]), GREEDY, keep=True
    )
    assert toks == [7, 3]


@pytest.mark.parametrize("strategy", ["rejection", "topp"])
def test_max_dec_len_token_of_a_draw_is_kept(backend, strategy):
    """REJECTION's / TOPP's Phase-2 draw at ``max_dec_len`` (max_tokens 1, a prefill item):
    upstream replaces it by the end id; kept, it is the drawn candidate."""
    s = STRATEGIES[strategy]
    item = one_item(
        s, [7], slt=5, enc=5, step=0, max_dec=1, ids=[[6, 4, 9]], scores=[[0.2, 0.5, 0.3]],
        lens=[3], uniforms=[[0.0, 0.5]],
    )  # fmt: skip
    toks, _ = run_one(backend, item, s)
    assert toks == [EOS[0]]
    toks, _ = run_one(backend, item, s, keep=True)
    assert toks == [4]  # t = 0.5: cumulative 0.2, 0.7 -> the second candidate


def test_prefill_item_emits_one_token_from_its_single_row(backend):
    toks, _ = run_one(backend, one_item(GREEDY, [7, 8], slt=30, enc=30, target=[6]), GREEDY)
    assert toks == [6]


def test_decode_with_slt_1_emits_one_token(backend):
    toks, _ = run_one(backend, one_item(GREEDY, [7, 8], slt=1, target=[6]), GREEDY)
    assert toks == [6]


def test_reasoning_status_1_emits_exactly_one_token(backend):
    toks, _ = run_one(backend, one_item(GREEDY, [7, 8], reasoning=1, target=[7, 8, 6]), GREEDY)
    assert toks == [7]


def test_reject_all_emits_one_token_and_beats_accept_all(backend):
    toks, _ = run_one(
        backend,
        one_item(GREEDY, [7, 8], target=[7, 8, 6]),
        GREEDY,
        reject_all=True,
        accept_all=True,
    )
    assert toks == [7]


def test_accept_all_replaces_an_eos_draft_with_token_5(backend):
    toks, _ = run_one(backend, one_item(GREEDY, [2, 8], target=[0, 0, 6]), GREEDY, accept_all=True)
    assert toks == [5, 8, 6]


def test_accept_all_still_applies_max_dec_len(backend):
    toks, _ = run_one(
        backend,
        one_item(GREEDY, [7, 8], step=8, max_dec=10, target=[0, 0, 6]),
        GREEDY,
        accept_all=True,
    )
    assert toks == [7, EOS[0]]


@pytest.mark.parametrize("which", ["stopped", "paused"])
def test_stopped_and_paused_items_are_reset_and_emit_nothing(backend, which):
    tensors = one_item(
        GREEDY, [7], target=[7, 6], stop=which == "stopped", paused=which == "paused"
    )
    toks, row = run_one(backend, tensors, GREEDY)
    assert toks == [] and list(row) == [-1, -1]


def test_padding_slots_past_real_bsz_are_reset(backend):
    rng = np.random.default_rng(5)
    tensors = make_state(rng, 10, 3, GREEDY, real_bsz=4)
    got = check(backend, tensors, attrs(GREEDY), "padding")
    assert (got["step_output_ids"][4:] == -1).all() and (got["step_output_len"][4:] == 0).all()


def test_slt_zero_item_emits_nothing_instead_of_reading_the_next_items_row(backend):
    """Deviation: a running item with slt == 0 emits nothing (upstream would emit from row
    cu_seqlens_q_output[b], which belongs to the next item)."""
    tensors = one_item(GREEDY, [7], slt=0, target=[6, 6])
    toks, row = run_one(backend, tensors, GREEDY)
    assert toks == [] and list(row) == [-1, -1]


def test_batch_beyond_upstream_1024_cap(backend):
    """Deviation 1: any batch size (upstream: one block of 1024 threads)."""
    rng = np.random.default_rng(9)
    got = check(backend, make_state(rng, 3000, 2, GREEDY), attrs(GREEDY), "bsz=3000")
    assert (got["step_output_len"][1024:] != SENTINEL).all() and (
        got["step_output_len"][1024:] > 0
    ).any()


def test_rows_outside_the_row_tensors_are_never_read(backend):
    """A cu_seqlens_q_output pointing past the target rows: nothing is read or emitted there."""
    tensors = one_item(GREEDY, [7, 8], target=[7, 8, 6])
    tensors[3] = np.array([7, 8], np.int64)  # only two rows: the bonus row 2 is missing
    toks, _ = run_one(backend, tensors, GREEDY)
    assert toks == [7, 8]


# ---- TOPP with injected uniforms -------------------------------------------------------


def test_topp_accepts_membership_and_draws_with_the_injected_uniform(backend):
    ids = [[7, 4, 0, 0], [5, 6, 9, 0]]
    scores = [[0.5, 0.3, 0, 0], [0.5, 0.3, 0.2, 0]]
    # row 1: t = 0.9 * 0.9 = 0.81 > 0.8 -> third candidate
    tensors = one_item(
        TOPP, [4], ids=ids, scores=scores, lens=[2, 3], uniforms=[[0, 0], [0, 0.9]], topp=0.9
    )
    assert run_one(backend, tensors, TOPP)[0] == [4, 9]


def test_topp_falls_back_to_the_first_candidate_when_len_is_0(backend):
    tensors = one_item(
        TOPP,
        [4],
        ids=[[7, 4], [5, 6]],
        scores=[[0.5, 0.5], [0.5, 0.5]],
        lens=[2, 0],
        uniforms=[[0, 0], [0, 0.5]],
    )
    assert run_one(backend, tensors, TOPP)[0] == [4, 5]


# ---- REJECTION: exact cases with forced uniforms ----------------------------------------

REJ_IDS = [[7, 4, 9], [5, 6, 8]]
REJ_SCORES = [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]


def rej(backend, drafts, uniforms, **kw):
    tensors = one_item(
        REJECTION,
        drafts,
        ids=kw.pop("ids", REJ_IDS),
        scores=kw.pop("scores", REJ_SCORES),
        lens=kw.pop("lens", [3, 3]),
        uniforms=uniforms,
        **kw,
    )
    return run_one(backend, tensors, REJECTION)[0]


def test_rejection_accepts_iff_u_acc_is_below_p_draft(backend):
    # p(7) = 0.6 at row 0 (S = 1): u = 0.5999 accepts, u = 0.6001 rejects
    assert rej(backend, [7], [[0.5999, 0.0], [0.0, 0.0]]) == [7, 5]
    toks = rej(backend, [7], [[0.6001, 0.0], [0.0, 0.0]])
    assert toks == [4]  # residual draw at row 0 without 7: t = 0 -> first non-7 candidate


def test_rejection_residual_never_returns_the_rejected_draft(backend):
    for u in np.linspace(0.0, 0.999999, 25):
        toks = rej(backend, [7], [[0.99, u], [0.0, 0.0]])
        assert len(toks) == 1 and toks[0] in (4, 9), (u, toks)


def test_rejection_residual_inverse_cdf_is_exact(backend):
    # residual of row 0 without 7: {4: 0.3, 9: 0.1}, M = 0.4; u_draw 0.74 -> t 0.296 < 0.3 -> 4
    assert rej(backend, [7], [[0.99, 0.74], [0, 0]]) == [4]
    assert rej(backend, [7], [[0.99, 0.76], [0, 0]]) == [9]


def test_rejection_draft_outside_the_row_is_always_rejected_and_draws_from_full_p(backend):
    # 3 is an EOS id too; outside the row -> rejected; t = 0.65 * 1.0 -> cum 0.6, 0.9 -> 4
    assert rej(backend, [11], [[0.0, 0.65], [0, 0]]) == [4]


def test_rejection_p_draft_1_is_always_accepted(backend):
    ids = [[7, 4, 9], [5, 6, 8]]
    scores = [[1.0, 0.0, 0.0], [0.2, 0.5, 0.3]]
    assert rej(
        backend, [7], [[np.float32(1 - 2**-24), 0.0], [0, 0.99]], ids=ids, scores=scores
    ) == [7, 8]


def test_rejection_bonus_comes_from_the_last_row_over_full_p(backend):
    # both rows: draft 7 accepted at row 0, bonus at row 1: t = 0.5 * 1.0 -> cum .2, .7 -> 6
    assert rej(backend, [7], [[0.1, 0.0], [0.0, 0.5]]) == [7, 6]


@pytest.mark.parametrize("case", ["reject_all", "prefill", "slt_1", "reasoning"])
def test_rejection_early_breaks_draw_from_full_p_not_the_residual(backend, case):
    # u_draw 0.1 -> t 0.1 over full p -> 7 (a residual without 7 would give 4)
    kw = {"prefill": dict(enc=5, slt=5), "slt_1": dict(slt=1), "reasoning": dict(reasoning=1)}.get(
        case, {}
    )
    rows = 1 if case in ("prefill", "slt_1") else 2
    tensors = one_item(
        REJECTION,
        [7],
        ids=REJ_IDS[:rows],
        scores=REJ_SCORES[:rows],
        lens=[3] * rows,
        uniforms=[[0.99, 0.1]] * rows,
        **kw,
    )
    assert run_one(backend, tensors, REJECTION, reject_all=case == "reject_all")[0] == [7]


def test_rejection_all_zero_row_falls_back_to_the_first_id(backend):
    tensors = one_item(
        REJECTION, [], slt=1, ids=[[6, 4, 9]], scores=[[0, 0, 0]], lens=[3], uniforms=[[0.5, 0.5]]
    )
    assert run_one(backend, tensors, REJECTION)[0] == [6]


def test_rejection_and_topp_are_deterministic_across_repeats(backend):
    for s in (TOPP, REJECTION):
        tensors = make_state(np.random.default_rng(3), 64, 3, s)
        first = backend.run(OP, tensors, attrs(s))
        for _ in range(2):
            again = backend.run(OP, tensors, attrs(s))
            for name, a, b in zip(NAMES, first, again):
                if a is not None:
                    assert_exact(name, b, a, context="repeat")


def test_rejection_results_depend_on_seed_and_position_not_on_the_slot(backend):
    """Position-keyed uniforms: the same request gives the same tokens in any slot."""
    probs = np.array([[0.4, 0.3, 0.2, 0.1, 0, 0]] * 3)
    ids, scores, lens = rejection_candidates(probs, 6)

    def run_in_slot(slot, bsz=5):
        tensors = make_state(np.random.default_rng(0), bsz, 2, REJECTION)
        tensors[8][:] = True  # every other slot stopped
        tensors[8][slot] = False
        tensors[12][:] = False
        tensors[2][slot] = [1, 0, 1]
        tensors[10][:] = 0
        tensors[10][slot] = 3
        tensors[9][slot] = 0
        tensors[14][slot] = 0
        tensors[15][slot] = 1000
        tensors[13][:] = 0
        tensors[4], tensors[5], tensors[6] = ids, scores, lens
        tensors[17] = np.stack(
            [position_uniforms(42, 100 + np.arange(3), c) for c in (0, 1)], axis=1
        )
        got = check(backend, tensors, attrs(REJECTION), f"slot {slot}")
        return list(got["step_output_ids"][slot]), int(got["step_output_len"][slot])

    results = {tuple(run_in_slot(s)[0]) for s in range(5)}
    assert len(results) == 1, results
    assert any(tok != -1 for tok in results.pop())


def _chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof > x) = Q(dof/2, x/2), by the series of the regularised lower gamma."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    term = total = 1.0 / a
    n = 1
    while term > total * 1e-15:
        term *= z / (a + n)
        total += term
        n += 1
    return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))


def test_rejection_emits_tokens_distributed_as_the_target_for_a_one_hot_drafter(backend):
    """Statistical losslessness. 20,000 independent requests (one item each) propose the
    same drafts d = (0, 1, 2) against fixed rows p_0..p_3 (6 candidates, unnormalised
    scores). Uniforms: Philox position_uniforms keyed by (seed = item, position, column).
    At each position i, among the items whose tokens 0..i-1 equal the drafts (the prefix
    the target conditioned row i on), the emitted token must follow p_i: a chi-square
    goodness-of-fit test per position (dof 5), failing only if its p-value < 1e-4. The
    seeds are fixed, so the test is deterministic; with a correct kernel the chance that
    some position falls below the threshold is < 4e-4."""
    n_items, k = 20_000, 3
    p = np.array(
        [
            [0.50, 0.20, 0.10, 0.10, 0.06, 0.04],
            [0.05, 0.55, 0.15, 0.10, 0.10, 0.05],
            [0.10, 0.10, 0.60, 0.10, 0.05, 0.05],
            [0.30, 0.25, 0.20, 0.15, 0.05, 0.05],
        ]
    )
    ids_row = np.array([3, 1, 0, 5, 2, 4])  # candidate order is free: not sorted, not by id
    w = k + 1
    rows = n_items * w
    ids = np.tile(ids_row, (rows, 1)).astype(np.int64)
    scores = np.tile(np.stack([p[i][ids_row] * 2.0 for i in range(w)]), (n_items, 1)).astype(
        np.float32
    )
    items = np.repeat(np.arange(n_items), w)
    pos = np.tile(np.arange(w), n_items)
    uniforms = np.stack([position_uniforms(items + 1, 1000 + pos, c) for c in (0, 1)], axis=1)
    inp = np.tile(np.array([9, 0, 1, 2], np.int64), (n_items, 1))
    tensors = [
        np.full((n_items, w), SENTINEL, np.int64),
        np.zeros(n_items, np.int32),
        inp,
        None,
        ids,
        scores,
        np.full(rows, 6, np.int32),
        np.ones((n_items, 1), np.float32),
        np.zeros((n_items, 1), bool),
        np.zeros(n_items, np.int32),
        np.full(n_items, w, np.int32),
        np.array([[99]], np.int64),
        np.zeros(n_items, bool),
        (np.arange(n_items) * w).astype(np.int32),
        np.zeros((n_items, 1), np.int32),
        np.full((n_items, 1), 10_000, np.int64),
        np.zeros((n_items, 1), np.int64),
        uniforms,
    ]
    got = backend.run(OP, tensors, attrs(REJECTION))
    out, n = got[0], got[1]
    drafts = np.array([0, 1, 2])
    reached = np.ones(n_items, bool)
    for i in range(w):
        assert (n[reached] > i).all(), "an item that reached position i must emit a token there"
        tok = out[reached, i]
        counts = np.bincount(tok, minlength=6)
        expected = p[i] * reached.sum()
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        pval = _chi2_sf(chi2, 5)
        assert pval > 1e-4, (
            f"position {i}: chi2 {chi2:.1f} (p = {pval:.2e}) over {reached.sum()} draws, counts "
            f"{counts}"
        )
        if i < k:
            reached &= out[:, i] == drafts[i]
    assert reached.sum() > 2000  # the bonus position was tested on enough draws


# ---- TOPP without uniforms: the built-in counter-based generator ------------------------


def test_philox_4x32_10_matches_the_published_known_answers():
    """Random123's known-answer vectors (first output word) for the numpy Philox."""
    m = 0xFFFFFFFF
    assert int(_philox4x32_10(0, 0, 0, 0, 0, 0)) == 0x6627E8D5
    assert int(_philox4x32_10(m, m, m, m, m, m)) == 0x408F276D
    pi = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)
    assert int(_philox4x32_10(*pi)) == 0xD16CFE09


@pytest.mark.parametrize("bsz", [1, 7, 64, 1500])
def test_topp_without_uniforms_matches_reference(backend, bsz):
    """Upstream's tests call TOPP with no uniforms input: every backend draws the same
    tokens from Philox keyed by (fixed seed, slot, step_idx), as the reference does."""
    rng = np.random.default_rng(600 + bsz)
    tensors = make_state(rng, bsz, 3, TOPP, real_bsz=bsz if bsz < 7 else bsz - 3)
    tensors[17] = None
    check(backend, tensors, attrs(TOPP), f"topp, no uniforms, bsz={bsz}")


def test_topp_without_uniforms_draws_with_the_built_in_uniform(backend):
    """One bonus draw whose token is decided by topp_uniforms(slot 0, step_idx 41): the
    kernels' Philox and seed agree with fastdeploy_mtp.ops.sampling bit for bit."""
    ids = [[7, 4, 0, 0], [5, 6, 9, 8]]
    scores = [[0.5, 0.3, 0, 0], [0.25, 0.25, 0.25, 0.25]]
    u = float(topp_uniforms(0, 41))
    want = [5, 6, 9, 8][min(int(u * 4), 3)]  # cumsum 0.25, 0.5, 0.75, 1.0; t = u * 1.0
    tensors = one_item(TOPP, [4], ids=ids, scores=scores, lens=[2, 4], step=41)
    assert run_one(backend, tensors, TOPP)[0] == [4, want]


def test_topp_built_in_uniforms_depend_on_slot_and_step_and_repeat():
    u = topp_uniforms(np.arange(4)[:, None], np.arange(1000)[None, :])
    assert u.dtype == np.float32 and (u >= 0).all() and (u < 1).all()
    assert len(np.unique(u)) > 3900 and abs(float(u.mean()) - 0.5) < 0.02
    np.testing.assert_array_equal(u, topp_uniforms(np.arange(4)[:, None], np.arange(1000)[None, :]))


def test_rejection_still_requires_uniforms(backend):
    tensors = _valid(REJECTION)
    tensors[17] = None
    assert_rejected(backend, OP, NAMES, tensors, "verify_uniforms", attrs(REJECTION))


# ---- hardening: widths, out-of-range values, padded arrays, huge lengths ----------------


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_width_0_rows_are_never_indexed(backend, strategy):
    """Issue 13: K + 1 = 0 wrote out[0] of an empty row. Now such a row emits nothing."""
    s = STRATEGIES[strategy]
    tensors = make_state(np.random.default_rng(21), 5, 2, s)
    tensors[0] = np.zeros((5, 0), np.int64)
    tensors[2] = np.zeros((5, 0), np.int64)
    got = check(backend, tensors, attrs(s), f"width 0 {strategy}")
    assert (got["step_output_len"] == 0).all() and got["step_output_ids"].shape == (5, 0)


def test_negative_seq_lens_this_time_counts_as_zero_on_every_backend(backend):
    """Formerly rejected on host tensors only; now every backend clamps (no device sync)."""
    tensors = make_state(np.random.default_rng(3), 6, 3, GREEDY)
    tensors[10] = np.array([1, 2, -1, 1, -(2**31), 1], np.int32)
    got = check(backend, tensors, attrs(GREEDY), "negative slt")
    assert got["step_output_len"][2] == 0 and got["step_output_len"][4] == 0


def test_step_idx_at_int64_max_saturates_and_stops(backend):
    tensors = one_item(GREEDY, [7, 8], step=2**63 - 1, max_dec=2**63 - 1, target=[7, 8, 6])
    toks, _ = run_one(backend, tensors, GREEDY)
    assert toks == [EOS[0]]


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_per_item_arrays_and_step_input_ids_may_have_more_rows_than_slots(backend, strategy):
    s = STRATEGIES[strategy]
    base = make_state(np.random.default_rng(31), 6, 3, s)
    want = reference(base, attrs(s))
    padded = list(base)
    for i in (2, 7, 8, 9, 12, 14, 15, 16):
        padded[i] = np.concatenate([base[i], np.ones((2,) + base[i].shape[1:], base[i].dtype)])
    got = backend.run(OP, padded, attrs(s))
    for name, g in zip(NAMES[:2], got[:2]):
        assert_exact(name, g, want[name], context=backend.name)


def test_huge_length_and_offset_values_cost_no_more_than_the_buffers(backend):
    """seq_lens_this_time = 2**31 - 1 and cu_seqlens_q_output near the int32 limits: work is
    bounded by the row width and the row tensors (rows outside them are never read)."""
    from tests.ops.child_process import run_op_in_child as run_in_child

    for s in (GREEDY, TOPP, REJECTION):
        tensors = make_state(np.random.default_rng(40 + s), 64, 5, s)
        tensors[10][::2] = 2**31 - 1
        tensors[13][1::4] = 2**31 - 1
        tensors[13][3::4] = -(2**31)
        tensors[15][::3] = 2**63 - 1
        want = reference(tensors, attrs(s))
        got = run_in_child(backend, OP, tensors, attrs(s))
        for name, g in zip(NAMES, got):
            if g is not None:
                assert_exact(name, g, want[name], context=f"{backend.name} strategy {s}")


# ---- bad input --------------------------------------------------------------------------


def _valid(strategy=REJECTION):
    return make_state(np.random.default_rng(3), 6, 3, strategy)


BAD_INPUTS = {
    # case: (strategy, tensor index or None, builder, name in the message, attrs override)
    "step_output_ids_int32": (REJECTION, 0, lambda t: t[0].astype(np.int32), "step_output_ids"),
    "step_output_len_int64": (REJECTION, 1, lambda t: t[1].astype(np.int64), "step_output_len"),
    "candidate_scores_float64": (
        REJECTION,
        5,
        lambda t: t[5].astype(np.float64),
        "candidate_scores",
    ),
    "verify_uniforms_float64": (
        REJECTION,
        17,
        lambda t: t[17].astype(np.float64),
        "verify_uniforms",
    ),
    "target_tokens_int32": (GREEDY, 3, lambda t: t[3].astype(np.int32), "target_tokens"),
    "stop_flags_int32": (GREEDY, 8, lambda t: t[8].astype(np.int32), "stop_flags"),
    "step_input_ids_width_k": (GREEDY, 2, lambda t: t[2][:, :-1].copy(), "step_input_ids"),
    "step_input_ids_batch_5": (GREEDY, 2, lambda t: t[2][:5].copy(), "step_input_ids"),
    "topp_batch_5": (TOPP, 7, lambda t: t[7][:5].copy(), "topp"),
    "step_idx_batch_1": (GREEDY, 16, lambda t: np.zeros((1, 1), np.int64), "step_idx"),
    "seq_lens_this_time_too_many": (
        GREEDY,
        10,
        lambda t: np.ones(7, np.int32),
        "seq_lens_this_time",
    ),
    "cu_seqlens_q_output_short": (GREEDY, 13, lambda t: t[13][:3].copy(), "cu_seqlens_q_output"),
    "candidate_lens_rows": (REJECTION, 6, lambda t: t[6][:-1].copy(), "candidate_lens"),
    "candidate_scores_cols": (REJECTION, 5, lambda t: t[5][:, :2].copy(), "candidate_scores"),
    "verify_uniforms_one_column": (REJECTION, 17, lambda t: t[17][:, :1].copy(), "verify_uniforms"),
    "end_tokens_empty": (GREEDY, 11, lambda t: np.zeros((0, 1), np.int64), "end_tokens"),
    "rejection_without_uniforms": (REJECTION, 17, lambda t: None, "verify_uniforms"),
    "topp_without_candidate_ids": (TOPP, 4, lambda t: None, "candidate_ids"),
    "greedy_without_target_tokens": (GREEDY, 3, lambda t: None, "target_tokens"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_tensor_and_changes_nothing(backend, case):
    strategy, index, build, name = BAD_INPUTS[case]
    tensors = _valid(strategy)
    tensors[index] = build(tensors)
    assert_rejected(backend, OP, NAMES, tensors, name, attrs(strategy))


@pytest.mark.parametrize("strategy", [-1, 4])
def test_unknown_verify_strategy_is_rejected(backend, strategy):
    assert_rejected(backend, OP, NAMES, _valid(GREEDY), "verify_strategy", attrs(strategy))


def test_paddle_topp_call_without_verify_uniforms():
    """FastDeploy's TOPP call passes no uniforms: the Paddle op works without the keyword."""
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    tensors = make_state(np.random.default_rng(8), 7, 3, TOPP)
    tensors[17] = None
    want = reference(tensors, attrs(TOPP))
    pt = {
        n: None if a is None else paddle.to_tensor(a)
        for n, a in zip(NAMES, tensors)
        if n != "verify_uniforms"
    }
    ops.verify_draft_tokens(
        **pt, max_seq_len=4096, verify_window=2, verify_strategy=ops.VerifyStrategy.TOPP
    )
    np.testing.assert_array_equal(pt["step_output_ids"].numpy(), want["step_output_ids"])
    np.testing.assert_array_equal(pt["step_output_len"].numpy(), want["step_output_len"])


def test_paddle_op_takes_keyword_arguments_and_the_enum():
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    tensors = one_item(GREEDY, [7, 8], target=[7, 8, 6])
    pt = {n: (None if a is None else paddle.to_tensor(a)) for n, a in zip(NAMES, tensors)}
    ops.verify_draft_tokens(
        **dict(reversed(list(pt.items()))), verify_strategy=ops.VerifyStrategy.GREEDY
    )
    np.testing.assert_array_equal(pt["step_output_ids"].numpy(), [[7, 8, 6]])
    np.testing.assert_array_equal(pt["step_output_len"].numpy(), [3])


def test_verify_strategy_from_string_takes_fastdeploy_s_names_in_any_case():
    """FastDeploy's ``VerifyStrategy.from_string`` (its op tests and configuration use it)."""
    from fastdeploy_mtp.ops import VerifyStrategy

    assert VerifyStrategy.from_string("topp") is VerifyStrategy.TOPP
    assert VerifyStrategy.from_string("TOPP") is VerifyStrategy.TOPP
    assert VerifyStrategy.from_string("greedy") is VerifyStrategy.GREEDY
    assert VerifyStrategy.from_string("target_match") is VerifyStrategy.TARGET_MATCH
    assert VerifyStrategy.from_string(" Rejection ") is VerifyStrategy.REJECTION
    for bad in ("invalid", "", "top_p", 1):
        with pytest.raises(ValueError, match="topp.*greedy.*target_match.*rejection"):
            VerifyStrategy.from_string(bad)  # type: ignore[arg-type]
