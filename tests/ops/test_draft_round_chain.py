"""The draft-side ops composed over several MTP rounds, on every backend against the
references: draft_model_preprocess -> (speculate_pre_process -> draft_model_update) x S ->
draft_model_postprocess -> mtp_step_paddle, with the target's verify results drawn at random
between rounds. Each op consumes the state the previous op left, so the chain pins that the
ops agree with each other, not only one state at a time."""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.draft_model_postprocess import draft_model_postprocess as ref_post
from tests.reference.draft_model_preprocess import NAMES as PRE, draft_model_preprocess as ref_pre
from tests.reference.draft_model_update import NAMES as UPD, draft_model_update as ref_upd
from tests.reference.speculate_pre_process import (
    INPUTS as SPP_IN,
    OUTPUTS as SPP_OUT,
    speculate_pre_process as ref_spp,
)
from tests.support.compare import assert_all_exact
from tests.support.op_states import preprocess_state

POST = (
    "base_model_draft_tokens",
    "base_model_seq_lens_this_time",
    "base_model_seq_lens_encoder",
    "base_model_stop_flags",
)


def run(backend, op, names, tensors, reference, attrs=(), outputs=(), context=""):
    want = reference(tensors)
    got = backend.run(op, list(tensors), attrs, outputs)
    all_names = tuple(names) + tuple(spec[0] for spec in outputs)
    assert_all_exact(all_names, got, want, context=f"{backend.name} {op} {context}")
    return dict(zip(all_names, got))


@pytest.mark.parametrize(
    "bsz,k,steps", [(7, 1, 1), (64, 3, 3), (64, 5, 2), (64, 8, 8), (1500, 3, 2)]
)
def test_rounds_of_draft_ops_match_the_references(backend, bsz, k, steps):
    rng = np.random.default_rng(bsz * 31 + k)
    w = k + 1
    state = dict(zip(PRE, preprocess_state(rng, bsz, k, num_model_step=steps)))
    for rnd in range(3):
        ctx = f"round {rnd} bsz={bsz} k={k} steps={steps}"
        pre = run(
            backend,
            "draft_model_preprocess",
            PRE,
            [state[n] for n in PRE],
            lambda t: ref_pre(*t, num_model_step=steps, is_splitwise_prefill=False),
            (steps, False),
            context=ctx,
        )
        state.update(pre)
        for s in range(steps):
            slt, enc = state["seq_lens_this_time"], state["seq_lens_encoder"]
            token_num = int(np.maximum(slt, 0).sum())
            spp_in = [
                state["input_ids"],
                slt,
                state["draft_tokens"],
                enc,
                state["seq_lens_decoder"],
            ]
            specs = [
                (n, shape, dt)
                for n, shape, dt in zip(
                    SPP_OUT,
                    [(token_num,), (token_num,)] + [(bsz + 1,)] * 3 + [(bsz * w,), (1,)],
                    [np.int64] + [np.int32] * 6,
                )
            ]
            run(
                backend,
                "speculate_pre_process",
                SPP_IN,
                spp_in,
                lambda t: ref_spp(*t, cpu_token_num=token_num),
                (token_num,),
                specs,
                context=f"{ctx} s={s}",
            )
            sampled = rng.integers(0, 1000, size=int((slt > 0).sum())).astype(np.int64)
            upd_in = [
                sampled,
                state["draft_tokens"],
                state["pre_ids"],
                slt,
                enc,
                state["seq_lens_decoder"],
                state["step_idx"],
                np.zeros((bsz + 1, 1), np.int32),
                state["stop_flags"],
                state["not_need_stop"],
                state["max_dec_len"],
                np.array([[2]], np.int64),
                state["target_model_draft_tokens"],
            ]
            upd = run(
                backend,
                "draft_model_update",
                UPD,
                upd_in,
                lambda t: ref_upd(*t, max_seq_len=64, substep=s),
                (64, s),
                context=f"{ctx} s={s}",
            )
            state.update({n: upd[n] for n in UPD if n in state})
            state["target_model_draft_tokens"] = upd["base_model_draft_tokens"]
        target_slt = rng.integers(0, w + 1, size=bsz).astype(np.int32)
        post = run(
            backend,
            "draft_model_postprocess",
            POST,
            [
                state["target_model_draft_tokens"],
                target_slt,
                state["target_model_seq_lens_encoder"],
                state["target_model_stop_flags"],
            ],
            lambda t: ref_post(*t),
            context=ctx,
        )
        # every running decode item feeds exactly its non -1 draft slots next
        running = (~state["target_model_stop_flags"][:, 0]) & (
            state["target_model_seq_lens_encoder"] == 0
        )
        counts = (post["base_model_draft_tokens"] != -1).sum(axis=1)
        np.testing.assert_array_equal(
            post["base_model_seq_lens_this_time"][running], counts[running]
        )
        # the target verifies: new accepted counts, steps and stops for the next round
        state["accept_num"] = rng.integers(1, w + 1, size=bsz).astype(np.int32)
        state["accept_tokens"] = rng.integers(0, 1000, size=(bsz, w)).astype(np.int64)
        state["target_model_step_idx"] = (
            state["target_model_step_idx"] + state["accept_num"][:, None]
        )
        state["target_model_seq_lens_decoder"] = (
            state["target_model_seq_lens_decoder"] + state["accept_num"]
        )
        state["target_model_stop_flags"] = state["target_model_stop_flags"] | (
            rng.random((bsz, 1)) < 0.1
        )
