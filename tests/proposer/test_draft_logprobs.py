"""Draft logprobs (``include_draft_logprobs``) in the offline engine: each step reports, for
the slots that asked, the MTP drafts the target verified and their log-probabilities, equal
to ``log_softmax`` of the MTP layer's logits at that draft's row recomputed here from the
captured logits; the steps' positions follow the acceptance rule; a slot that did not ask
gets nothing, no request asking computes nothing, and without speculation the list is empty.
"""

from __future__ import annotations

import math

import numpy as np

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.constants import PLACEHOLDER_TOKEN_ID
from fastdeploy_mtp.proposer.sampler import MTPSampler
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.support.engines import make_config

ASK = SamplingParams(logprobs=0, include_draft_logprobs=True)
PROMPTS = [[3, 9, 14, 1, 7, 22, 5], [40, 2, 2, 8, 31], [11, 12, 13, 14, 15, 16]]


def requests(flags: list[bool]) -> list[Request]:
    return [
        Request(
            f"r{i}", PROMPTS[i], max_tokens=16, sampling=ASK if flag else SamplingParams(logprobs=0)
        )
        for i, flag in enumerate(flags)
    ]


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    shifted = row - row.max()
    return shifted - math.log(np.exp(shifted).sum())


def test_draft_logprobs_equal_the_mtp_layers_log_softmax(random_model):
    target, mtp = random_model
    engine = build_engine(make_config(3, steps=3), target, mtp)
    runner = engine.runner
    proposer = runner.proposer
    rounds: list[list[tuple[np.ndarray, np.ndarray]]] = []  # per round: (logits, slt) per substep
    logits_of, run_of, execute_of = proposer._logits, proposer.run, runner.execute

    def capture_logits(hidden, layer):
        out = logits_of(hidden, layer)
        rounds[-1].append(
            (out.numpy().copy(), proposer.model_inputs.seq_lens_this_time.numpy().copy())
        )
        return out

    def run(*args, **kwargs):
        rounds.append([])
        return run_of(*args, **kwargs)

    checked = {"drafts": 0}

    def execute():
        previous = rounds[-1] if rounds else []
        out = execute_of()
        asked = {
            idx
            for idx, st in engine.scheduler.slots.items()
            if st.request.sampling.include_draft_logprobs
        }
        assert set(out.draft_logprobs) == asked  # the slot that did not ask gets nothing
        for b, got in out.draft_logprobs.items():
            verified = [int(d) for d in out.drafts[b] if int(d) != PLACEHOLDER_TOKEN_ID]
            assert [lp.token_id for lp in got] == verified  # one entry per verified draft, in order
            for j, lp in enumerate(got):
                row_logits, slt = previous[j]
                row = int(np.count_nonzero(slt[:b] > 0))  # the running slots are compacted
                want = log_softmax(row_logits[row])
                assert lp.token_id == int(np.argmax(row_logits[row]))  # the greedy draft
                assert math.isfinite(lp.logprob) and lp.logprob <= 0.0
                assert abs(lp.logprob - want[lp.token_id]) < 1e-4, (lp, want[lp.token_id])
                checked["drafts"] += 1
        return out

    proposer._logits, proposer.run, runner.execute = capture_logits, run, execute
    reqs = requests([True, False, True])
    engine.generate(reqs)
    assert checked["drafts"] > 10

    for req in reqs:
        steps = req.output_draft_logprobs
        if not req.sampling.include_draft_logprobs:
            assert steps == []
            continue
        assert (
            steps and steps[0].position == 1
        )  # the prefill step emits token 0 and verifies no drafts
        for step, following in zip(steps, steps[1:]):
            accepted = 0
            for j, lp in enumerate(step.drafts):
                if req.output_token_ids[step.position + j] != lp.token_id:
                    break
                accepted += 1
            # the target emits the accepted drafts and one token of its own
            assert following.position == step.position + accepted + 1


def test_nothing_is_computed_unless_asked_and_no_speculation_gives_an_empty_list(
    random_model, monkeypatch
):
    target, mtp = random_model
    calls = []
    record = MTPSampler.record
    monkeypatch.setattr(MTPSampler, "record", lambda self, *a: calls.append(a) or record(self, *a))
    reqs = requests([False, False])
    build_engine(make_config(3, steps=3), target, mtp).generate(reqs)
    assert calls == [] and all(r.output_draft_logprobs == [] for r in reqs)

    plain = requests([True])
    build_engine(make_config(0), target).generate(plain)
    assert plain[0].output_token_ids and plain[0].output_draft_logprobs == []


def test_the_flag_needs_logprobs():
    problem = SamplingParams(include_draft_logprobs=True).check()
    assert problem is not None and problem.startswith("include_draft_logprobs:")
