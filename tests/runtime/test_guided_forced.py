"""Free drafts from the grammar (:mod:`fastdeploy_mtp.runtime.guided_forced`).

On the shipped tiny byte model, offline:

* with every drafting method (MTP, the MTP + n-gram hybrid, ``ngram``, ``naive``, and MTP
  rounds that skip the MTP layer) a constrained output is the same as without speculation,
  greedy and seeded, and the grammar's forced drafts are offered; since the byte model's
  forced token is the only one its masked row allows, every forced draft offered to a request
  that ends at EOS is accepted, and ``max_tokens`` is the one thing that leaves some
  unaccepted;
* forced drafts go in front of the method's drafts, which stay only where they agree with
  the forced prefix; the grammar check before verification never cuts them (units on
  :class:`~fastdeploy_mtp.runtime.guided.GuidedSlots`).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.engine_args import build_config, default_speculative_config, speculative_config
from fastdeploy_mtp.models import ASSETS_DIR, load_tiny
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.engine import Engine
from fastdeploy_mtp.runtime.guided import GuidedSlots
from fastdeploy_mtp.runtime.guided_forced import merge_forced
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.support.guided_cases import EOS, SCHEMA, TOK, V

# each ends at EOS on this model (a complete grammar allows only EOS)
CONSTRAINTS = [
    {"kind": "json", "spec": SCHEMA},
    {"kind": "regex", "spec": r"id=[0-9]{2}; name=[a-z]{1,4}; done"},
    {"kind": "choice", "spec": ["import numpy as np", "import paddle"]},
]
SEEDED = {"temperature": 0.8, "seed": 11}
METHODS = {
    "mtp_k3_s3": speculative_config(3, 3, False),
    "hybrid_k3_s1": speculative_config(3, 1, True),
    "ngram": SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3}),
    "naive": SpeculativeConfig.from_dict({"method": "naive", "num_speculative_tokens": 3}),
    # the default: the draft planner (per-request methods, 0 drafts, the MTP layer skipped)
    "planner": default_speculative_config(),
}


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def engine(shipped, spec: SpeculativeConfig) -> Engine:
    target, mtp, arch = shipped
    cfg = build_config(arch, spec, 8, 256)
    cfg.scheduler_config.max_num_batched_tokens = 4096
    cfg.model_config.model = ASSETS_DIR
    return build_engine(cfg, target, mtp if spec.method == "mtp" else None)


def requests(sampling: dict, max_tokens: int = 80) -> list[Request]:
    return [
        Request(
            f"c{i}-{j}",
            TOK.encode(DEMO_PROMPTS[j][:30]),
            max_tokens=max_tokens,
            sampling=SamplingParams(guided=guided, **sampling),
        )
        for i, guided in enumerate(CONSTRAINTS)
        for j in range(2)
    ]


def run(eng: Engine, reqs: list[Request]) -> dict[str, list[int]]:
    eng.generate(reqs)
    eng.close()
    return {r.request_id: r.output_token_ids for r in reqs}


def skipping_mtp_rounds(eng: Engine) -> list[int]:
    """Make every decode round of ``eng``'s MTP proposer skip the MTP layer (its
    ``skip_round``: no MTP drafts; prefill rounds still run it). Returns the list that counts
    the skipped rounds."""
    runner = eng.runner
    proposer, step_output, run_round = runner.proposer, runner._step_output, runner.proposer.run
    last: dict = {}
    skipped: list[int] = []

    def capture(step):
        out = step_output(step)
        last.update(out=out, rows_start=step.rows.cu[:-1], prefill=(step.enc > 0).any())
        return out

    def round_(hidden, **kw):
        if last["prefill"]:
            return run_round(hidden, **kw)
        skipped.append(1)
        return proposer.skip_round(hidden, last["out"], last["rows_start"])

    runner._step_output, proposer.run = capture, round_
    return skipped


@pytest.fixture(scope="module")
def plain(shipped):
    return {
        mode: run(engine(shipped, speculative_config(0, None, False)), requests(sampling))
        for mode, sampling in (("greedy", {}), ("seeded", SEEDED))
    }


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
@pytest.mark.parametrize("method", [*METHODS, "mtp_skipping_the_layer"])
def test_forced_drafts_are_offered_accepted_and_change_no_output(shipped, plain, method, mode):
    spec = METHODS.get(method, speculative_config(3, 3, False))
    eng = engine(shipped, spec)
    skipped = skipping_mtp_rounds(eng) if method == "mtp_skipping_the_layer" else []
    reqs = requests(SEEDED if mode == "seeded" else {})
    assert run(eng, reqs) == plain[mode]
    assert all(r.finish_reason == "stop" and r.output_token_ids[-1] == EOS for r in reqs)
    m = eng.metrics
    # every request ended at EOS: nothing ended before a forced draft it was offered
    assert m.forced_drafts_accepted == m.forced_drafts_proposed > 0, method
    # forced drafts are inside the draft counters
    assert m.proposed.sum() >= m.forced_drafts_proposed
    assert m.accepted.sum() >= m.forced_drafts_accepted
    if method == "naive":  # the method drafts nothing: every draft is the grammar's
        assert m.proposed.sum() == m.forced_drafts_proposed
    if method == "planner":  # the planner's method mix counts every verified draft
        assert sum(v[0] for v in m.method_drafts.values()) == m.proposed.sum()
    if skipped:  # more forced drafts than the prefill rounds' MTP drafts could hold
        assert len(skipped) >= 10 and m.forced_drafts_proposed > 3 * len(reqs)


def test_max_tokens_leaves_forced_drafts_unaccepted(shipped):
    """The schema forces ``{"name":"``: the prefill emits ``{``, the next round is offered
    ``"na`` (K = 3) and max_tokens = 3 takes two of them."""
    eng = engine(shipped, METHODS["naive"])
    req = Request(
        "cut", TOK.encode("x"), max_tokens=3, sampling=SamplingParams(guided=CONSTRAINTS[0])
    )
    run(eng, [req])
    assert req.output_token_ids == list(b'{"n') and req.finish_reason == "length"
    assert (eng.metrics.forced_drafts_proposed, eng.metrics.forced_drafts_accepted) == (3, 2)


# ---- units ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "drafts, forced, want",
    [
        ([5, 6, 7], [5, 6], [5, 6, 7]),  # the method's drafts agree: the third one stays
        ([5, 9, 7], [5, 6], [5, 6, -1]),  # made after a different prefix: dropped
        ([5], [5, 6], [5, 6, -1]),  # fewer drafts than forced tokens
        ([], [5, 6, 8], [5, 6, 8]),
        ([4, 6, 7], [], [4, 6, 7]),  # nothing forced: the row is unchanged
    ],
)
def test_merge_forced_keeps_only_drafts_that_follow_the_forced_prefix(drafts, forced, want):
    row = np.array([1, *drafts, *[-1] * (3 - len(drafts))], np.int64)
    n = merge_forced(row, 1 + len(drafts), forced)
    assert row.tolist() == [1, *want] and n == 1 + sum(t != -1 for t in want)


def test_merge_forced_refuses_more_tokens_than_the_row_holds():
    with pytest.raises(ValueError, match="`forced` has 3 tokens"):
        merge_forced(np.array([1, -1, -1], np.int64), 1, [1, 2, 3])


class Target:
    """The draft rows of ``share_inputs``: slot 0 decodes with the method's drafts, slot 1 is
    in prefill, slot 2 stopped, slot 3 decodes without drafts."""

    def __init__(self, drafts: list[list[int]]):
        self.draft_tokens = paddle.to_tensor(np.array(drafts, np.int64))
        self.seq_lens_this_time = paddle.to_tensor(
            [1 + sum(t != -1 for t in row[1:]) for row in drafts], dtype="int32"
        )
        self.seq_lens_this_time[1] = 7
        self.seq_lens_this_time[2] = 0
        self.seq_lens_encoder = paddle.to_tensor([0, 7, 0, 0], dtype="int32")


def test_forced_drafts_go_first_survive_the_grammar_check_and_are_counted():
    regex = {"kind": "regex", "spec": "ab(cd|ce)[0-9]+"}
    a, b, c, d, z = (ord(ch) for ch in "abcdz")
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    for idx in range(4):
        slots.start(idx, regex)
    # the step: slots 0, 2 and 3 emit 'a' (slot 1 is in a non-final prefill chunk: no mask)
    n = np.array([1, 7, 1, 1])
    slots.prepare(np.full([4, 4], -1, np.int64), n, np.array([0, 7, 0, 0]), {1})
    slots.advance(np.array([[a, -1, -1, -1]] * 4), np.array([1, 1, 1, 1]))
    before = slots.matchers[0].compute_bitmask()
    assert slots.forced_drafts(3) == {0: [b, c], 2: [b, c], 3: [b, c]}
    assert slots.forced_drafts(1) == {0: [b], 2: [b], 3: [b]}
    assert slots.matchers[0].compute_bitmask() == before  # the state did not move
    # slot 0's method drafted "bz..." (a different prefix: dropped); slot 3 drafted nothing
    target = Target([[a, b, z, d], [0, -1, -1, -1], [a, -1, -1, -1], [a, -1, -1, -1]])
    counts = slots.offer_forced(target)
    assert counts.tolist() == [2, 0, 0, 2]
    assert target.draft_tokens.numpy().tolist() == [
        [a, b, c, -1],
        [0, -1, -1, -1],
        [a, -1, -1, -1],
        [a, b, c, -1],
    ]
    assert target.seq_lens_this_time.numpy().tolist() == [3, 7, 0, 3]
    # the next step: the grammar check keeps them, the target accepts 'b', 'c' of slot 0 and
    # emits 'c' after slot 3's 'b' (a planner cut its drafts to one: 'b' only is offered)
    slots.drop(2)
    limits = slots.prepare(
        np.array([[a, b, c, -1], [0, -1, -1, -1], [a, -1, -1, -1], [a, b, -1, -1]]),
        np.array([3, 0, 0, 2]),
        np.zeros(4, np.int64),
        set(),
    )
    assert limits is None and slots.stats.cut == 0 and slots.stats.forced == 3
    stats = slots.advance(
        np.array([[b, c, d, -1], [0] * 4, [0] * 4, [b, c, -1, -1]]), np.array([3, 0, 0, 2])
    )
    assert (stats.forced, stats.forced_accepted) == (3, 3)
    assert slots.forced_drafts(3) == {}  # "abcd" wants a digit, "abc" 'd' or 'e'


def test_nothing_is_forced_where_the_grammar_branches_or_is_complete():
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    slots.start(0, {"kind": "choice", "spec": ["yes", "no"]})
    slots.start(1, {"kind": "choice", "spec": ["ok"]}, [ord("o")])
    slots.prepare(np.full([2, 2], -1, np.int64), np.array([1, 1]), np.zeros(2, np.int64), set())
    slots.advance(np.array([[ord("y"), -1], [ord("k"), -1]]), np.array([1, 1]))
    assert slots.forced_drafts(3) == {0: [ord("e"), ord("s")]}  # "ok" is complete: only EOS
    target = Target([[1, 7, -1], [ord("k"), -1, -1], [0, -1, -1], [0, -1, -1]])
    assert slots.offer_forced(target).tolist() == [2, 0, 0, 0]
    assert target.draft_tokens.numpy()[0].tolist() == [1, ord("e"), ord("s")]
    unconstrained = GuidedSlots(ASSETS_DIR, V, [EOS])
    assert unconstrained.offer_forced(target).tolist() == [0, 0, 0, 0]
