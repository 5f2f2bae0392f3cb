"""Serving and training agree on what each MTP substep computes.

Every draft the proposer made in a greedy run is recomputed from the finished sequence with
the training path (:func:`fastdeploy_mtp.models.mtp_unrolled.unrolled_mtp_forward` over the
target's dense hidden states): draft ``j`` of a round is depth ``j`` at the row before the
token it guesses, and it must be that row's argmax whenever drafts ``1 .. j - 1`` of the round
were the real tokens (otherwise serving fed different tokens than the sequence has). This
covers the attention pattern of substeps (one shared layer and distinct layers with their
own caches), the MTP caches across rounds, and rows written back after rounds the adaptive
draft length skipped.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.models import causal_bias, load_tiny
from fastdeploy_mtp.models.mtp_layer import MTPStack, mtp_layers_of
from fastdeploy_mtp.models.mtp_unrolled import unrolled_mtp_forward
from fastdeploy_mtp.proposer.skipped_rounds import SkippedRounds
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.support.engines import adaptive_spec, make_config

PROMPT = b"    def __init__(self, name, value):\n        self.name = name\n        self."


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def three_layer_stack(target, mtp, config):
    """Three distinct layers: the shipped layer's weights, perturbed per layer."""
    cfg = type(config).from_dict({**config.to_dict(), "num_nextn_predict_layers": 3})
    stack = MTPStack(cfg, target)
    base = mtp_layers_of(mtp)[0].state_dict()
    for i, layer in enumerate(stack.layers):
        rng = np.random.default_rng(i)
        layer.set_state_dict(
            {
                k: paddle.to_tensor(
                    v.numpy() + (0.02 * i) * rng.standard_normal(v.shape).astype(np.float32)
                )
                for k, v in base.items()
            }
        )
    stack.eval()
    return stack


def run_recording(
    target,
    mtp,
    spec: SpeculativeConfig,
    prompt: list[int],
    max_tokens: int,
    history=None,
    beside: list[Request] = (),
    cost=None,
):
    cfg = make_config(
        1, max_num_seqs=2, max_model_len=512, vocab=272, ori_vocab=256, hidden=128, block_size=16
    )
    cfg.speculative_config = spec
    cfg.model_config.eos_token_id = [256]
    engine = build_engine(cfg, target, mtp)
    runner = engine.runner
    rounds = []  # (tokens known before the step, drafts verified in it)
    original = runner.execute
    known = {"n": len(prompt)}

    def execute():
        out = original()
        if out.decode_mask[0]:
            rounds.append((known["n"], out.drafts[0].copy()))
        if out.accept_num[0] > 0:
            known["n"] += int(out.accept_num[0])
        return out

    runner.execute = execute
    if runner.planner is not None:  # its choices follow a fixed machine, not this one's load
        planner, record = runner.planner, runner.planner.record

        def steady_record(running_slots: int, drafts: int, seconds: float, prefill: bool) -> None:
            """A step costs 10 ms plus 50 ms per MTP substep, whatever the wall clock measured
            (a busy CI host's noisy step times changed how often the MTP layer was skipped):
            the planner skips it except in its probes."""
            seconds = 0.010 + 0.050 * planner.steps if cost is None else cost(planner.steps)
            record(running_slots, drafts, seconds, prefill)

        planner.record = steady_record
    if history is not None:  # after each replay of skipped rows: the draft's token history
        proposer = runner.proposer
        replay = proposer._catch_up

        def checked_catch_up():
            replay()
            target_in = runner.share_inputs
            step = int(target_in.step_idx[0, 0])
            plen = int(target_in.prompt_lens[0, 0])
            want = target_in.token_ids_all[0, plen : plen + step].numpy().tolist()
            history.append(proposer.model_inputs.pre_ids[0, :step].numpy().tolist() == want)

        proposer._catch_up = checked_catch_up
    first = Request("r0", prompt, max_tokens=max_tokens, sampling=SamplingParams())
    if beside:
        first.sampling.speculative_method = "mtp"
    out = engine.generate([first, *beside])
    return list(prompt) + list(out["r0"]), rounds


def dense_drafts(target, mtp, seq: list[int], depth: int) -> list[np.ndarray]:
    """``out[k-1][p]``: depth-``k`` argmax at row ``p`` (guesses ``seq[p + 2]``)."""
    ids = paddle.to_tensor(np.asarray([seq], np.int64))
    with paddle.no_grad():
        pre, post = target.forward_dense(ids, causal_bias(len(seq)))
        hidden = target.mtp_hidden(pre, post)
        outs = unrolled_mtp_forward(mtp_layers_of(mtp), ids[:, 1:], hidden[:, :-1], depth)
        layers = mtp_layers_of(mtp)
        return [
            layers[k % len(layers)].compute_logits(o[0]).argmax(-1).numpy()
            for k, o in enumerate(outs)
        ]


def check(seq, rounds, dense, k):
    checked = [0] * k
    for n, drafts in rounds:
        for j in range(1, k + 1):
            d = int(drafts[j - 1])
            if d < 0 or n + j - 1 >= len(seq):
                break
            row = n + j - 3
            if row < j - 1:
                break
            want = int(dense[j - 1][row])
            assert d == want, f"round at {n}: draft {j} is {d}, the training path says {want}"
            checked[j - 1] += 1
            if d != seq[n + j - 1]:
                break  # later drafts were fed a token the sequence does not have
    return checked


@pytest.mark.parametrize("layers", [1, 3])
def test_substeps_match_the_unrolled_training_path(shipped, layers):
    target, mtp, config = shipped
    model = mtp if layers == 1 else three_layer_stack(target, mtp, config)
    spec = SpeculativeConfig(method="mtp", num_speculative_tokens=3, num_model_steps=3)
    seq, rounds = run_recording(target, model, spec, list(PROMPT), 48)
    checked = check(seq, rounds, dense_drafts(target, model, seq, 3), 3)
    assert checked[0] >= 8 and checked[1] >= 3 and checked[2] >= 1, checked


def test_rows_of_skipped_rounds_reach_the_mtp_cache(shipped):
    """A substep that costs five plain steps: the planner skips the MTP layer for most rounds
    and runs it only in its probes (every 2, 4, 8, ... rounds): each probe's draft must still
    equal the training path's, i.e. the rows of the skipped rounds were written into the MTP
    cache before it drafted. (Rejection sampling keeps the drafts the MTP layer's own: the
    planner offers no model-free ones then; greedy requests are verified by argmax.)"""
    target, mtp, _ = shipped
    spec = adaptive_spec(2, window=8, interval=2, verify_strategy="rejection")
    history: list[bool] = []
    seq, rounds = run_recording(target, mtp, spec, list(PROMPT), 64, history)
    assert history and all(history), history  # replays also restored the draft's token history
    plain = sum(1 for _, d in rounds if (d < 0).all())
    assert plain >= 10, f"only {plain} rounds without drafts"
    checked = check(seq, rounds, dense_drafts(target, mtp, seq, 2), 2)
    assert checked[0] >= 3, checked


def test_a_request_the_mtp_layer_never_sees_leaves_the_others_drafts_exact(shipped):
    """Beside ``r0`` (pinned to the MTP layer), a request pinned to suffix decoding is admitted
    without the MTP layer (its draft slot stays stopped, its rows are never replayed): ``r0``'s
    every MTP draft must still be the training path's."""
    target, mtp, _ = shipped
    spec = adaptive_spec(3, window=8, interval=4, steps=3)
    other = Request(
        "other",
        list(b"for i in range(10):\n    x = x + i\n"),
        max_tokens=40,
        sampling=SamplingParams(speculative_method="suffix"),
    )
    seq, rounds = run_recording(
        target,
        mtp,
        spec,
        list(PROMPT),
        48,
        beside=[other],
        cost=lambda steps: 0.010 + 0.001 * steps,
    )
    checked = check(seq, rounds, dense_drafts(target, mtp, seq, 3), 3)
    assert checked[0] >= 8 and checked[1] >= 3, checked


def test_skipped_rows_beside_a_request_the_mtp_layer_never_sees_are_kept_alone(
    shipped, monkeypatch
):
    """As above (the MTP layer skipped but in the planner's probes), with a request beside
    ``r0`` that the MTP layer never sees (it asks for no drafts): the skipped rounds keep only
    ``r0``'s rows, gathered out of the step's, and each probe's drafts (and the draft's token
    history after each replay) must still be the training path's."""
    target, mtp, _ = shipped
    kept: list[tuple[int, int]] = []  # (the step's rows, the rows a skipped round keeps)
    record = SkippedRounds.record

    def spy(self, hidden, *args):
        before = len(self.rounds)
        record(self, hidden, *args)
        if len(self.rounds) > before:
            kept.append((int(hidden.shape[0]), int(self.rounds[-1].hidden.shape[0])))

    monkeypatch.setattr(SkippedRounds, "record", spy)
    other = Request(
        "other",
        list(b"for i in range(10):\n    x = x + i\n"),
        max_tokens=60,
        sampling=SamplingParams(speculative_method="none"),
    )
    spec = adaptive_spec(2, window=8, interval=2, verify_strategy="rejection")
    history: list[bool] = []
    seq, rounds = run_recording(target, mtp, spec, list(PROMPT), 64, history, [other])
    assert any(rows < step for step, rows in kept), kept
    assert history and all(history), history
    checked = check(seq, rounds, dense_drafts(target, mtp, seq, 2), 2)
    assert checked[0] >= 3, checked


def test_a_skipped_round_that_keeps_few_rows_packs_them_where_its_starts_say():
    """Slots 0 and 2 decode beside slot 1, which the MTP layer does not see: only their rows
    are kept, packed, and each slot's start points at its own rows."""
    hidden = paddle.arange(8 * 2, dtype="float32").reshape([8, 2])  # [T, H]: row r = 2r, 2r+1
    rounds = SkippedRounds()
    accept = np.array([1, 4, 2])
    rounds.record(
        hidden,
        paddle.to_tensor([[5], [9], [7]], dtype="int64"),
        np.arange(15).reshape(3, 5),
        accept,
        np.array([0, 2, 6]),  # slot 0: row 0; slot 1: rows 2..5; slot 2: rows 6, 7
        np.array([True, False, True]),
    )
    (kept,) = rounds.rounds
    assert kept.hidden.shape[0] == 3 and kept.counts.tolist() == [1, 0, 2]
    for slot, first in ((0, 0), (2, 6)):
        a, start = int(kept.counts[slot]), int(kept.rows_start[slot])
        np.testing.assert_array_equal(
            kept.hidden[start : start + a].numpy(), hidden[first : first + a].numpy()
        )
