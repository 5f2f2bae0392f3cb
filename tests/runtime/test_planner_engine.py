"""The draft planner through the engine on the shipped checkpoint: the requests of one batch
draft with several methods, pinned requests keep theirs, a machine where drafting does not pay
decodes plainly, and every output equals plain decoding's. The step costs are a fixed
machine's, so the choices do not follow this host's load. (Which method a free request gets
is the planner's unit tests' subject, with acceptance set per method: the shipped model's own
outputs repeat themselves, so n-gram and suffix drafts do well on every prompt.)"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.models import load_tiny
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.draft_methods import METHOD_LABELS
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.support.engines import adaptive_spec, make_config

#: text the model continues by repeating what it already saw (suffix / n-gram territory)
REPETITIVE = [
    ("    x = compute(x)\n" * 6).encode(),
    ("assert value == 1\n" * 6).encode(),
]
FREE_FORM = [p.encode() for p in DEMO_PROMPTS[:2]]


@pytest.fixture(scope="module")
def shipped():
    target, mtp, _ = load_tiny()
    return target, mtp


def cheap_drafts(running: int, drafts: int, steps: int) -> float:
    """A machine like a CPU at a small batch: a substep costs half a plain step, a draft
    2% of a slot's step."""
    return 0.001 * running * (1 + 0.5 * steps) + 2e-5 * drafts


def engine_on_a_fixed_machine(shipped, slots: int, spec=None, cost=cheap_drafts):
    target, mtp = shipped
    cfg = make_config(
        3, max_num_seqs=slots, max_model_len=512, vocab=272, ori_vocab=256, hidden=128,
        block_size=16,
    )  # fmt: skip
    cfg.speculative_config = spec or adaptive_spec(
        3, window=8, interval=16, steps=1, mtp_strategy="with_ngram"
    )
    cfg.model_config.eos_token_id = [256]
    engine = build_engine(cfg, target, mtp if cfg.speculative_config.enabled else None)
    planner = engine.runner.planner
    if planner is not None:
        record = planner.record

        def fixed(running: int, drafts: int, seconds: float, prefill: bool) -> None:
            record(running, drafts, cost(running, drafts, planner.steps), prefill)

        planner.record = fixed
    return engine


def per_request_methods(engine) -> dict[str, collections.Counter]:
    """Run-time hook: the drafts each request verified, by method."""
    runner, seen = engine.runner, collections.defaultdict(collections.Counter)
    execute = runner.execute

    def counted():
        out = execute()
        for idx, state in engine.scheduler.slots.items():
            code = int(out.draft_methods[idx])
            if code >= 0:
                rid = state.request.request_id
                seen[rid][METHOD_LABELS[code]] += int((out.drafts[idx] >= 0).sum())
        return out

    runner.execute = counted
    return seen


def requests(pins=None, seeded=False):
    prompts = REPETITIVE + FREE_FORM
    out = []
    for i, p in enumerate(prompts):
        sp = SamplingParams(temperature=0.8, seed=7 + i) if seeded else SamplingParams()
        sp.ignore_eos = True
        if pins:
            sp.speculative_method = pins[i]
        out.append(Request(f"r{i}", list(p), max_tokens=96, sampling=sp))
    return out


@pytest.mark.parametrize("seeded", [False, True])
def test_each_request_gets_its_own_method_and_outputs_stay_plain(shipped, seeded):
    plain = engine_on_a_fixed_machine(shipped, 4, spec=make_config(0).speculative_config)
    want = plain.generate(requests(seeded=seeded))
    engine = engine_on_a_fixed_machine(shipped, 4)
    seen = per_request_methods(engine)
    assert engine.generate(requests(seeded=seeded)) == want
    used = sum((c for c in seen.values()), collections.Counter())
    assert len(used) >= 2 and sum(used.values()) > 0, seen  # per request, not one for all
    assert any(len(c) >= 2 for c in seen.values()), seen  # and re-chosen as a request runs
    m = engine.metrics
    assert sum(v[0] for v in m.method_drafts.values()) == int(m.proposed.sum())


def test_pinned_requests_keep_their_method(shipped):
    plain = engine_on_a_fixed_machine(shipped, 4, spec=make_config(0).speculative_config)
    pins = ["mtp", "none", "suffix", "ngram"]
    want = plain.generate(requests())
    engine = engine_on_a_fixed_machine(shipped, 4)
    seen = per_request_methods(engine)
    assert engine.generate(requests(pins)) == want
    assert set(seen["r0"]) <= {"mtp"} and seen["r0"]["mtp"] > 0
    assert "r1" not in seen  # "none": never a draft
    assert set(seen["r2"]) <= {"suffix"} and seen["r2"]["suffix"] > 0
    assert set(seen["r3"]) <= {"ngram"} and seen["r3"]["ngram"] > 0


def test_where_drafting_does_not_pay_the_engine_decodes_plainly(shipped):
    """A machine where a draft costs as much as a slot's whole step and a substep half of one
    (a CPU at a large batch): after its measurements the planner keeps plain decoding but for
    its probes, and the requests admitted then are never seen by the MTP layer (no prompt
    forward); every output is still plain decoding's."""

    def costly(running: int, drafts: int, steps: int) -> float:
        return 0.001 * (running + drafts) * (1 + 0.5 * steps)

    def batch():
        return requests() + [
            Request(f"late{i}", r.prompt_token_ids, max_tokens=96, sampling=r.sampling)
            for i, r in enumerate(requests()[:2])
        ]

    plain = engine_on_a_fixed_machine(shipped, 2, spec=make_config(0).speculative_config)
    want = plain.generate(batch())
    engine = engine_on_a_fixed_machine(shipped, 2, cost=costly)
    planner, proposer = engine.runner.planner, engine.runner.proposer
    modes, unseen = [], set()
    original = planner.plan_round

    def watched(*args, **kwargs):
        plan = original(*args, **kwargs)
        modes.append((planner.mode, int(plan.limits.sum())))
        unseen.update(int(i) for i in np.nonzero(proposer.excluded)[0])
        return plan

    planner.plan_round = watched
    assert engine.generate(batch()) == want
    late = modes[len(modes) // 2 :]
    plain_rounds = sum(1 for mode, drafts in late if mode == -1 and drafts == 0)
    assert plain_rounds >= 0.8 * len(late), modes
    assert unseen, "no request was admitted without the MTP layer"
