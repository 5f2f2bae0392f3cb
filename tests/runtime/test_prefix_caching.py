"""Prefix caching (``cache_config.enable_prefix_caching``) changes nothing a request gets.

* The block pool: keys chain over the parent, cover the token after the block only with MTP
  layers, stop one token short of the prompt's end; references, LRU eviction (tail blocks
  first, never-cached blocks before cached ones), registration rules.
* Equality: the same workload (a shared system prompt ending mid-block, exact repeats, a
  multi-turn prompt that extends an earlier prompt and its answer, prompts cut by chunked
  prefill) with caching on and off, under every speculative method and MTP strategy,
  greedy and seeded sampling under every verify strategy. The outputs must be equal, and so
  must every draft the proposer made: a target block reused with the wrong MTP KV would still
  give the same output (the target verifies) but not the same drafts.
* Blocks: every reference returns when the requests end; hits happen (the test would pass
  trivially without them).
* The MTP KV a hit hands out equals a fresh prefill's; the negative control: keys without the
  token after the block (what a target-only cache would use) hand out MTP KV computed for
  another continuation.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.engine_args import build_config, default_speculative_config
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.runtime.block_pool import ROOT_KEY, BlockPool, block_keys
from fastdeploy_mtp.runtime.engine import Engine
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from fastdeploy_mtp.tenancy import cache_namespace

TOK = ByteTokenizer()
SYSTEM = "You are a careful assistant; answer briefly. "  # 45 bytes: ends mid-block (block 16)
QUESTIONS = [
    "Where is the harbor?",
    "def read_lines(path):",
    "Every morning the engineer",
    "Name three ships",
]
MAX_TOKENS = 12


# ---- the pool --------------------------------------------------------------------------------
def test_keys_chain_over_the_parent_and_stop_before_the_last_token():
    tokens = list(range(40))
    keys = block_keys(tokens, 8, include_next=True)
    assert len(keys) == (40 - 1) // 8 == 4  # block 4 ends at 40: no token after it in the prompt
    assert block_keys(tokens[:33], 8, True) == keys  # 33 tokens: blocks 0..3 each have a next token
    assert len(block_keys(tokens[:32], 8, True)) == 3
    other = [99] + tokens[1:]
    assert all(
        a != b for a, b in zip(block_keys(other, 8, True), keys)
    )  # a changed parent changes every key
    assert block_keys(tokens, 8, True)[0] != ROOT_KEY


def test_keys_cover_the_next_token_only_with_mtp_layers():
    a = list(range(20))
    b = a[:8] + [77] + a[9:]  # block 0 equal, the token after it differs
    assert block_keys(a, 8, True)[0] != block_keys(b, 8, True)[0]
    assert block_keys(a, 8, False)[0] == block_keys(b, 8, False)[0]


def test_pool_references_eviction_and_registration():
    pool = BlockPool(4, enable_caching=True)
    blocks = [pool.allocate() for _ in range(3)]
    assert blocks == [0, 1, 2] and pool.num_free == 1
    for block, key in zip(blocks, [b"k0", b"k1", b"k2"]):
        pool.register(block, key)
    pool.register(0, b"other")  # a block keeps its first key
    assert pool.lookup([b"k0", b"k1", b"k2", b"k3"]) == [0, 1, 2]
    assert pool.lookup([b"other"]) == []
    pool.take([0, 1])  # a second request shares the prefix
    pool.free(blocks)  # the first request ends: 2 becomes evictable, 0 and 1 stay referenced
    assert (pool.refs(0), pool.refs(1), pool.refs(2)) == (1, 1, 0)
    assert pool.num_free == 2 and pool.num_cached == 3
    pool.free([0, 1])  # tail first: 1 is freed before 0, so it is evicted before 0
    assert pool.total_refs() == 0
    assert pool.allocate() == 3  # a never-cached block before any cached one
    assert pool.allocate() == 2  # then least recently freed: 2, then 1, then 0
    assert pool.lookup([b"k0", b"k1", b"k2"]) == [0, 1]
    assert pool.allocate() == 1
    assert pool.lookup([b"k0", b"k1"]) == [0]
    pool.take([0])
    with pytest.raises(IndexError):
        pool.allocate()
    pool.free([0, 1, 2, 3])
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([3])
    with pytest.raises(RuntimeError, match="no request references"):
        pool.register(3, b"k9")


def test_pool_without_caching_finds_nothing_and_frees_to_the_list():
    pool = BlockPool(2, enable_caching=False)
    b = pool.allocate()
    pool.register(b, b"k")
    pool.free([b])
    assert pool.lookup([b"k"]) == [] and pool.num_cached == 0 and pool.num_free == 2


# ---- equality --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def workload(sampled: bool, first_outputs: dict[str, list[int]] | None = None) -> list[Request]:
    """Staggered arrivals so later requests find the earlier ones' blocks cached."""
    prompts = [SYSTEM + q for q in QUESTIONS] + [SYSTEM + QUESTIONS[0], SYSTEM + QUESTIONS[2]]
    reqs = []
    for i, text in enumerate(prompts):
        sp = (
            SamplingParams(temperature=0.8, top_p=0.9, seed=11 + i) if sampled else SamplingParams()
        )
        reqs.append(Request(f"r{i}", TOK.encode(text), MAX_TOKENS, arrival_step=2 * i, sampling=sp))
    return reqs


def second_turn(first: Request, step: int) -> Request:
    """A multi-turn prompt: the first turn's prompt and answer, then more."""
    prompt = list(first.prompt_token_ids) + list(first.output_token_ids) + TOK.encode(" And then?")
    return Request(
        f"{first.request_id}-turn2", prompt, MAX_TOKENS, arrival_step=step, sampling=first.sampling
    )


def run(
    shipped, spec: SpeculativeConfig, caching: bool, sampled: bool, chunk: int
) -> tuple[dict, dict, Engine]:
    target, mtp, arch = shipped
    cfg = build_config(arch, spec, 3, 256)
    cfg.cache_config.enable_prefix_caching = caching
    eng = build_engine(
        cfg, target, mtp if spec.enabled else None, prefill_chunk_size=chunk, record_trace=True
    )
    reqs = workload(sampled)
    eng.generate(reqs)
    turns = [second_turn(r, 0) for r in reqs[:2]]
    for t in turns:
        t.sampling = SamplingParams.from_dict(t.sampling.to_dict())
    eng.generate(turns)
    outputs = {r.request_id: list(r.output_token_ids) for r in reqs + turns}
    drafts: dict[str, list] = defaultdict(list)
    for _step, rid, task, new, made in eng.trace or []:
        drafts[rid].append((task, new, made))
    eng.close()
    return outputs, dict(drafts), eng


MTP = {"method": "mtp", "num_speculative_tokens": 3}
CONFIGS = {
    "none": {"method": None},
    "mtp-k3-s1": {**MTP, "num_model_steps": 1},
    "mtp-k3-s3": MTP,
    "mtp-hybrid": {**MTP, "num_model_steps": 1, "mtp_strategy": "with_ngram"},
    "mtp-adaptive": {**MTP, "adaptive_draft_length": True},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "suffix": {"method": "suffix", "num_speculative_tokens": 3},
    "naive": {"method": "naive"},
}
CASES = [(name, "greedy", 0) for name in CONFIGS] + [
    ("mtp-k3-s3", "target_match", 0),
    ("mtp-k3-s1", "rejection", 7),
    ("mtp-hybrid", "topp", 0),
    (
        "mtp-adaptive",
        "target_match",
        0,
    ),  # not rejection: its samples depend on the drafts, which adaptive times
    ("none", "target_match", 5),
    ("suffix", "target_match", 0),
    ("mtp-k3-s3", "greedy", 16),
]


@pytest.mark.parametrize(
    ("name", "strategy", "chunk"), CASES, ids=[f"{n}-{s}-chunk{c}" for n, s, c in CASES]
)
def test_outputs_and_drafts_equal_with_and_without_prefix_caching(shipped, name, strategy, chunk):
    spec = SpeculativeConfig.from_dict(dict(CONFIGS[name]))
    sampled = strategy != "greedy"
    if spec.enabled:
        spec.verify_strategy = strategy
    want, want_drafts, _ = run(shipped, spec, False, sampled, chunk)
    got, got_drafts, eng = run(shipped, spec, True, sampled, chunk)
    assert got == want
    if (
        name != "mtp-adaptive"
    ):  # adaptive drafting decides lengths from timings; outputs are what it guarantees
        assert got_drafts == want_drafts
    pool = eng.scheduler.pool
    assert pool.hit_tokens >= 3 * 16, (
        "the workload found nothing cached: the test would prove nothing"
    )
    assert pool.total_refs() == 0 and pool.num_free == eng.scheduler.total_blocks
    assert not eng.scheduler.held


def test_hits_start_after_whole_blocks_and_multi_turn_prompts_hit_their_first_turn(shipped):
    _, mtp, arch = shipped
    cfg = build_config(arch, SpeculativeConfig.from_dict(dict(MTP)), 3, 256)
    cfg.cache_config.enable_prefix_caching = True
    eng = build_engine(cfg, shipped[0], mtp)
    first = Request("a", TOK.encode(SYSTEM + QUESTIONS[0]), MAX_TOKENS)
    eng.generate([first])
    again = Request("b", TOK.encode(SYSTEM + QUESTIONS[1]), MAX_TOKENS)
    eng.generate([again])
    assert again.num_cached_tokens == 32  # the 45-byte system prompt: two whole blocks
    turn = second_turn(first, 0)
    eng.generate([turn])
    assert (
        turn.num_cached_tokens == (len(first.prompt_token_ids) - 1) // 16 * 16
    )  # prompt blocks only
    eng.close()


def test_requests_share_blocks_only_within_their_namespace(shipped):
    """Two tenants (namespaces) send the same prompt: neither finds the other's blocks, each
    finds its own, and every output equals the one without caching."""
    _, mtp, arch = shipped
    cfg = build_config(arch, SpeculativeConfig.from_dict(dict(MTP)), 3, 256)
    cfg.cache_config.enable_prefix_caching = True
    eng = build_engine(cfg, shipped[0], mtp)
    prompt = TOK.encode(SYSTEM + QUESTIONS[0])
    a, b = cache_namespace(b"a" * 32, None), cache_namespace(b"b" * 32, None)
    order = [
        ("a1", a),
        ("b1", b),
        ("g1", b""),
        ("a2", a),
        ("b2", b),
        ("s1", cache_namespace(None, "s")),
    ]
    reqs = {}
    for rid, ns in order:
        reqs[rid] = Request(rid, prompt, MAX_TOKENS, cache_namespace=ns)
        eng.generate([reqs[rid]])
    eng.close()
    hits = {rid: r.num_cached_tokens for rid, r in reqs.items()}
    full = (len(prompt) - 1) // 16 * 16  # every whole block before the last prompt token
    assert full >= 48
    assert hits == {"a1": 0, "b1": 0, "g1": 0, "a2": full, "b2": full, "s1": 0}
    assert len({tuple(r.output_token_ids) for r in reqs.values()}) == 1


def test_blocks_without_mtp_kv_are_cached_apart_and_keep_the_mtp_layer_out(shipped):
    """The draft planner admits a request without the MTP layer (here: it pins n-gram
    drafts): its prompt's MTP KV is never written, so its blocks go to a chain of their own.
    A request that hits that chain (longer than the full one) is admitted without the MTP
    layer too (its drafts would be made from missing KV); one pinned to the MTP layer never
    looks there; once a request the MTP layer saw cached the prompt, the full chain wins."""
    _, mtp, arch = shipped
    cfg = build_config(arch, default_speculative_config(), 3, 256)
    cfg.cache_config.enable_prefix_caching = True
    eng = build_engine(cfg, shipped[0], mtp)
    prompt = TOK.encode(SYSTEM + QUESTIONS[0])
    pins = ["ngram", None, "mtp", None]
    reqs = [
        Request(f"{i}", prompt, MAX_TOKENS, sampling=SamplingParams(speculative_method=pin))
        for i, pin in enumerate(pins)
    ]
    unseen = []
    for req in reqs:
        eng.generate([req])
        unseen.append(bool(eng.runner.planner.no_mtp[req.idx]))
    eng.close()
    full = (len(prompt) - 1) // 16 * 16
    assert [r.num_cached_tokens for r in reqs] == [0, full, 0, full]
    assert [r.prefix_without_mtp for r in reqs] == [False, True, False, False]
    assert unseen[:3] == [True, True, False]
    assert len({tuple(r.output_token_ids) for r in reqs}) == 1


def mtp_kv(eng: Engine, req: Request, blocks: int) -> list[np.ndarray]:
    """The MTP layers' KV of ``req``'s first ``blocks`` blocks (copies)."""
    runner = eng.runner
    mtp_caches = runner.host_caches()[0][len(runner.caches) :]
    assert mtp_caches, "no MTP layer caches"
    ids = np.asarray(req.block_tables[:blocks])
    return [np.array(c[ids], dtype=np.float64) for c in mtp_caches]


def test_mtp_kv_of_a_hit_equals_a_fresh_prefill_and_a_target_only_key_would_not(shipped):
    """The MTP layer's KV at a block's last position depends on the token after the block.
    Two prompts share whole blocks and fork right after one: with our keys the block before
    the fork is not shared and every MTP block the second request uses equals a fresh
    prefill's; keyed like a target-only cache (no next token) it would be shared, and the
    MTP KV at the fork would be the first prompt's (the negative control)."""
    target, mtp, arch = shipped
    spec = SpeculativeConfig.from_dict(dict(MTP))
    base = TOK.encode("The tide came in over the old harbor wall and the ")
    cut = (len(base) // 16) * 16
    a_ids, b_ids = base[:cut] + TOK.encode("boats rocked"), base[:cut] + TOK.encode("gulls cried")

    def engine(caching: bool) -> Engine:
        cfg = build_config(arch, spec, 2, 256)
        cfg.cache_config.enable_prefix_caching = caching
        return build_engine(cfg, target, mtp)

    fresh_eng = engine(False)
    fresh = Request("b", b_ids, MAX_TOKENS)
    fresh_eng.generate([fresh])
    want = mtp_kv(fresh_eng, fresh, cut // 16)
    fresh_eng.close()
    for key_next in (True, False):
        eng = engine(True)
        eng.scheduler._key_next = key_next
        a, b = Request("a", a_ids, MAX_TOKENS), Request("b", b_ids, MAX_TOKENS)
        eng.generate([a])
        eng.generate([b])
        assert (
            b.output_token_ids == fresh.output_token_ids
        )  # the target verifies: outputs agree either way
        assert b.num_cached_tokens == (cut - 16 if key_next else cut)
        got = mtp_kv(eng, b, cut // 16)
        eng.close()
        same = all(np.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got, want))
        assert same is key_next, (
            f"key_next={key_next}: MTP KV {'differs from' if key_next else 'equals'} "
            "a fresh prefill's"
        )


@pytest.mark.parametrize("strategy", ["greedy", "target_match"])
def test_splitwise_decode_that_holds_the_prefix_copies_only_the_rest(shipped, strategy):
    """P/D with prefix caching on both instances: the decode instance's own cache already
    holds the shared prefix of later requests (from earlier hand-overs), so only the blocks
    after it are copied; the output is the mixed engine's without caching."""
    from tests.support.pd import LocalPD

    target, mtp, arch = shipped
    spec = SpeculativeConfig.from_dict(dict(MTP))
    spec.verify_strategy = strategy
    cfg = build_config(arch, spec, 3, 256)
    sampled = strategy != "greedy"
    mixed = build_engine(cfg, target, mtp)
    want = mixed.generate(workload(sampled))
    mixed.close()
    cfg.cache_config.enable_prefix_caching = True
    pd = LocalPD(cfg, target, mtp)
    assert pd.run(workload(sampled)) == want
    assert (
        pd.d.scheduler.pool.hit_tokens >= 3 * 32
    )  # the system prompt's two blocks, at least 3 times
    assert pd.copied_blocks < pd.offered_blocks
    for eng in (pd.p, pd.d):
        assert eng.scheduler.pool.total_refs() == 0 and not eng.scheduler.held
    pd.close()


@pytest.mark.parametrize("method", ["mtp", "suffix"])
def test_a_constrained_request_that_starts_after_a_hit_keeps_its_grammar(shipped, method):
    """Whatever starts a request in its slot (the grammar's matcher, the suffix trie) starts
    at its first chunk, which after a hit is not at position 0. Keyed on position 0 (as it
    once was), the second request here ran unconstrained."""
    from fastdeploy_mtp.models import ASSETS_DIR

    target, mtp, arch = shipped
    outs = []
    for caching in (False, True):
        cfg = build_config(
            arch,
            SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": 3}),
            2,
            256,
        )
        cfg.cache_config.enable_prefix_caching = caching
        cfg.model_config.model = ASSETS_DIR  # whose tokenizer.json the grammar runs on
        eng = build_engine(cfg, target, mtp if method == "mtp" else None)
        guided = {"kind": "regex", "spec": "[0-9]{3}-(bytes|blocks)"}
        reqs = [
            Request(
                f"g{i}", TOK.encode(SYSTEM + "Size? "), 16, sampling=SamplingParams(guided=guided)
            )
            for i in range(2)
        ]
        eng.generate(reqs[:1])
        eng.generate(reqs[1:])
        assert reqs[1].num_cached_tokens == (
            (len(reqs[1].prompt_token_ids) - 1) // 16 * 16 if caching else 0
        )
        outs.append([bytes(t for t in r.output_token_ids if t < 256).decode() for r in reqs])
        eng.close()
    assert outs[0] == outs[1]
    for text in outs[1]:
        assert re.fullmatch("[0-9]{3}-(bytes|blocks)", text), text
