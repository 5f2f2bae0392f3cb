"""The model-free drafting methods (``"ngram"``, ``"suffix"``, ``"naive"``) through the
proposer interface: their config keys, aliases and refusals; greedy and seeded output equal
to no speculation (drafts only change speed under ``target_match``); the suffix trie's
incremental updates equal a build from scratch; suffix drafts pay on a repetitive prompt."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.config import (
    FDConfig,
    SchedulerConfig,
    SpeculativeConfig,
    SpeculativeConfigError,
)
from fastdeploy_mtp.engine_args import (
    UsageError,
    build_config,
    check_speculative_config,
    speculation_label,
)
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.proposer.model_free import NaiveProposer, NgramProposer
from fastdeploy_mtp.proposer.suffix import (
    SEPARATOR,
    SlotSequences,
    SuffixCache,
    SuffixLimits,
    SuffixProposer,
    suffix_draft,
)
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.engine import Engine
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.reference.suffix_draft import suffix_draft_reference
from tests.support.engines import make_config, make_requests

TOK = ByteTokenizer()

#: method name -> extra speculative keys (the suffix method with and without the shared cache)
METHODS = {
    "ngram": ("ngram", {}),
    "suffix": ("suffix", {}),
    "suffix-nocache": ("suffix", {"suffix_decoding_max_cached_requests": 0}),
    "naive": ("naive", {}),
}
PROPOSERS = {"ngram": NgramProposer, "suffix": SuffixProposer, "naive": NaiveProposer}


def with_method(cfg: FDConfig, method: str, k: int, **keys) -> FDConfig:
    spec = SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": k, **keys})
    return dataclasses.replace(cfg, speculative_config=spec)


# ---- config ---------------------------------------------------------------------------------
def test_vllm_prompt_lookup_keys_are_aliases_of_the_ngram_sizes():
    spec = SpeculativeConfig.from_dict(
        {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    )
    assert (spec.max_ngram_size, spec.min_ngram_size) == (4, 1)
    same = SpeculativeConfig.from_dict(
        {"method": "ngram", "prompt_lookup_max": 4, "max_ngram_size": 4}
    )
    assert same.max_ngram_size == 4
    for alias, key in (
        ("prompt_lookup_max", "max_ngram_size"),
        ("prompt_lookup_min", "min_ngram_size"),
    ):
        with pytest.raises(SpeculativeConfigError, match=f"'{alias}' .*'{key}'"):
            SpeculativeConfig.from_dict({"method": "ngram", alias: 3, key: 2})


@pytest.mark.parametrize(
    "values,words",
    [
        ({"method": "eagle"}, "method must be one of"),
        (
            {"method": "suffix", "adaptive_draft_length": True},
            "adaptive_draft_length needs method 'mtp'",
        ),
        (
            {"method": "ngram", "mtp_strategy": "with_ngram"},
            "mtp_strategy 'with_ngram' needs method 'mtp'",
        ),
        (
            {"method": "suffix", "suffix_decoding_min_token_prob": 1.5},
            "suffix_decoding_min_token_prob",
        ),
        (
            {"method": "suffix", "suffix_decoding_max_tree_depth": 0},
            "suffix_decoding_max_tree_depth",
        ),
        (
            {"method": "suffix", "suffix_decoding_max_spec_factor": 0.0},
            "suffix_decoding_max_spec_factor",
        ),
        # int(factor * m) of a non-finite factor raises inside the drafting step
        (
            {"method": "suffix", "suffix_decoding_max_spec_factor": float("nan")},
            "suffix_decoding_max_spec_factor",
        ),
        (
            {"method": "suffix", "suffix_decoding_max_spec_factor": float("inf")},
            "suffix_decoding_max_spec_factor",
        ),
        (
            {"method": "suffix", "suffix_decoding_max_cached_requests": -1},
            "suffix_decoding_max_cached_requests",
        ),
        (
            {"method": "suffix", "suffix_decoding_max_cached_requests": 1.5},
            "suffix_decoding_max_cached_requests",
        ),
        # an alias of the wrong type is named as the client wrote it
        (
            {"method": "ngram", "prompt_lookup_max": True},
            "'prompt_lookup_max' must be an integer, got true",
        ),
        (
            {"method": "ngram", "prompt_lookup_min": [2]},
            r"'prompt_lookup_min' must be an integer, got \[2\]",
        ),
    ],
)
def test_bad_method_configs_are_refused_naming_the_key(values, words):
    with pytest.raises(SpeculativeConfigError, match=words):
        SpeculativeConfig.from_dict(values)


@pytest.mark.parametrize("method", ["ngram", "suffix", "naive"])
def test_model_free_methods_are_refused_on_splitwise_instances(method):
    spec = SpeculativeConfig.from_dict({"method": method})
    with pytest.raises(
        ValueError, match=f"method '{method}' is not supported with splitwise_role 'prefill'"
    ):
        FDConfig(
            speculative_config=spec, scheduler_config=SchedulerConfig(splitwise_role="prefill")
        )
    with pytest.raises(
        UsageError, match=f"method '{method}' is not supported with splitwise_role 'decode'"
    ):
        check_speculative_config(spec, "decode")
    check_speculative_config(spec, "mixed")
    assert speculation_label(spec) == f"{method} K=1"
    FDConfig(
        speculative_config=SpeculativeConfig.from_dict({"method": "mtp"}),
        scheduler_config=SchedulerConfig(splitwise_role="decode"),
    )


# ---- greedy equality (random model) -----------------------------------------------------------
def run(model, cfg, requests, chunk):
    target, mtp = model
    engine = build_engine(cfg, target, mtp, prefill_chunk_size=chunk)
    return engine.generate(requests), engine


CASES = [
    # (K, batch, chunk)
    (1, 1, 0),
    (3, 5, 7),
    (4, 8, 16),
]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("k,batch,chunk", CASES)
def test_greedy_output_equals_no_speculation(random_model, method, k, batch, chunk):
    count = max(batch, 6) if batch > 1 else 3
    base, _ = run(random_model, make_config(0, max_num_seqs=batch), make_requests(21, count), chunk)
    name, keys = METHODS[method]
    cfg = with_method(make_config(0, max_num_seqs=batch), name, k, **keys)
    out, engine = run(random_model, cfg, make_requests(21, count), chunk)
    assert out == base
    runner = engine.runner
    assert isinstance(runner.proposer, PROPOSERS[name])
    # no MTP layer state: no caches beyond the target's, nothing handed over with a slot
    assert runner.proposer.caches == [] and runner.all_cache_specs() == runner.cache_specs
    assert runner.proposer.model_inputs is None
    m = engine.metrics
    assert m.method == name and m.proposed.shape == (k,)
    if name == "naive":
        assert m.proposed.sum() == 0 and m.mean_accepted_length == 1.0
    else:
        # the random model's greedy outputs repeat themselves: drafts are offered and accepted
        assert m.accepted.sum() > 0 and m.mean_accepted_length > 1.0, m.as_dict()
        assert (m.accepted <= m.proposed).all()


# ---- seeded sampling equality (shipped checkpoint) ---------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


SAMPLING = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=7),
    SamplingParams(),  # greedy
    SamplingParams(temperature=1.0, top_k=20, seed=11),
    SamplingParams(temperature=0.7, seed=5, repetition_penalty=1.2, presence_penalty=0.3),
    SamplingParams(temperature=0.6, min_p=0.05, seed=3, frequency_penalty=0.4),
]


def sampled_requests(n: int) -> list[Request]:
    """Prompts of different lengths, each with its own sampling parameters."""
    return [
        Request(
            f"s{i}",
            TOK.encode(DEMO_PROMPTS[i % len(DEMO_PROMPTS)][: 12 + 9 * i]),
            max_tokens=28 - (i % 4),
            sampling=SamplingParams.from_dict(SAMPLING[i % len(SAMPLING)].to_dict()),
        )
        for i in range(n)
    ]


def shipped_engine(shipped, spec: SpeculativeConfig, batch: int) -> Engine:
    target, _, arch = shipped
    cfg = build_config(arch, spec, batch, 256)
    return build_engine(cfg, target, None, prefill_chunk_size=24)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("k,batch", [(2, 3), (3, 6)])
def test_seeded_sampling_equals_no_speculation(shipped, method, k, batch):
    """``target_match``: a sampled request emits its seeded samples, whatever the drafts."""
    base = shipped_engine(shipped, SpeculativeConfig(method=None), batch).generate(
        sampled_requests(7)
    )
    name, keys = METHODS[method]
    spec = SpeculativeConfig.from_dict({"method": name, "num_speculative_tokens": k, **keys})
    engine = shipped_engine(shipped, spec, batch)
    assert engine.generate(sampled_requests(7)) == base
    assert engine.metrics.method == name


# ---- suffix decoding's draft ---------------------------------------------------------------------
def draft_of(seqs: list[list[int]], context: list[int], depth: int, k: int, factor, prob):
    """:func:`suffix_draft` over ``seqs`` kept end to end as the shared cache keeps them."""
    cache = SuffixCache(len(seqs))
    for seq in seqs:
        cache.add(seq)
    limits = SuffixLimits(depth, k, factor, prob)
    d = suffix_draft(cache.sequence, np.asarray(context, np.int64), limits)
    return d.tokens, d.probs, d.match_len


@pytest.mark.parametrize("depth", [1, 2, 5, 24])
def test_suffix_draft_equals_the_window_counting_reference(depth):
    """One sequence (a request's own) and several (the shared cache: no window spans two),
    contexts that are the sequence itself (the own draft) and others, several limits."""
    rng = np.random.default_rng(depth)
    for trial in range(30):
        alphabet = int(rng.integers(2, 6))  # a small alphabet: many repeated windows
        seqs = [
            rng.integers(0, alphabet, size=int(rng.integers(1, 60))).tolist()
            for _ in range(int(rng.integers(1, 4)))
        ]
        contexts = [seqs[0], rng.integers(0, alphabet, size=int(rng.integers(0, 30))).tolist()]
        for context in contexts:
            for k, factor, prob in ((8, 1.0, 0.1), (5, 3.0, 0.0), (8, 0.5, 0.4), (1, 4.0, 0.0)):
                args = (seqs, context, depth, k, factor, prob)
                got = draft_of(*args)
                want = suffix_draft_reference(*args)
                assert got[0] == want[0] and got[2] == want[2], (trial, args)
                assert got[1] == pytest.approx(want[1]), (trial, args)


def test_suffix_draft_follows_the_most_frequent_continuation_within_its_limits():
    # "1 2 3" twice, "1 2 4" once: after "... 1 2" the draft is 3 (2 of 3 continuations),
    # then 8 (tied with 9 at 1 of 2: the smaller id)
    seq = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2]
    tokens, probs, m = draft_of([seq], seq, 8, 5, 4.0, 0.0)
    assert m == 2 and tokens[:2] == [3, 8]
    assert probs[:2] == pytest.approx([2 / 3, 1 / 3])
    assert probs == sorted(probs, reverse=True), "probabilities are cumulative products"
    assert draft_of([seq], seq, 8, 5, 0.5, 0.0)[0] == [3], "int(0.5 * 2) = 1 token"
    assert draft_of([seq], seq, 8, 5, 4.0, 0.7)[0] == [], "2/3 < 0.7"
    assert draft_of([seq], seq, 8, 1, 4.0, 0.0)[0] == [3], "at most K tokens"
    assert draft_of([seq], [5, 6], 8, 5, 4.0, 0.0)[0] == [], "no match"
    assert draft_of([[1, 2], [3, 4]], [2], 8, 5, 4.0, 0.0)[0] == [], "no window spans two"


def test_suffix_cache_keeps_the_newest_outputs_and_forgets_the_oldest():
    rng = np.random.default_rng(3)
    outs = [rng.integers(0, 5, size=int(rng.integers(1, 40))).tolist() for _ in range(6)]
    cache = SuffixCache(max_requests=2)
    for i, out in enumerate(outs):
        cache.add(out)
        kept = outs[max(0, i - 1) : i + 1]
        assert len(cache) == len(kept) and cache.outputs == kept
        assert cache.sequence.tolist() == [t for o in kept for t in (*o, SEPARATOR)]
    off = SuffixCache(max_requests=0)
    off.add(outs[0])
    assert len(off) == 0 and off.sequence.size == 0


def test_suffix_proposer_drafts_from_other_requests_outputs(random_model):
    """With the shared cache a request whose own history has no match drafts from a finished
    request's output: a second identical request gets its drafts accepted from its first
    decode step, and more of them than without the cache."""
    accepted = {}
    for cached in (0, 4):
        cfg = with_method(
            make_config(0, max_num_seqs=1), "suffix", 3, suffix_decoding_max_cached_requests=cached
        )
        reqs = [Request(f"q{i}", [5, 17, 33, 2, 40, 8], max_tokens=24) for i in range(2)]
        _, engine = run(random_model, cfg, reqs[:1], 0)
        first = engine.metrics.accepted.sum()
        engine.generate(reqs[1:])
        accepted[cached] = engine.metrics.accepted.sum() - first
        assert len(engine.runner.proposer.cache) == min(cached, 2)
    assert accepted[4] > accepted[0]


def test_suffix_drafts_pay_on_a_repetitive_prompt(shipped):
    """Measured on the shipped checkpoint: mean accepted length 2.17 at K = 3 (the output
    repeats the prompt's import lines); suffix decoding must keep well above plain decoding's
    1.0."""
    spec = SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 3})
    engine = shipped_engine(shipped, spec, 1)
    engine.generate([Request("rep", TOK.encode("import os\nimport sys\n" * 4), max_tokens=64)])
    assert engine.metrics.mean_accepted_length > 1.6, engine.metrics.as_dict()


def test_an_aborted_request_leaves_its_output_so_far_in_the_shared_cache(random_model):
    # the slot is freed before the proposer hears of the abort: its trie goes to the cache as
    # a finished request's does, and the proposer keeps no state of the slot
    cfg = with_method(make_config(0, max_num_seqs=1), "suffix", 3)
    engine = build_engine(cfg, *random_model)
    req = Request("gone", [5, 17, 33, 2, 40, 8], max_tokens=40)
    engine.add_requests([req])
    for step in range(4):
        engine.step(step)
    assert req.output_token_ids and engine.abort(req, RuntimeError("client left"))
    proposer = engine.runner.proposer
    assert len(proposer.cache) == 1 and not proposer.sequences.live.any()
    assert proposer.cache.outputs == [req.output_token_ids]


def test_slot_sequences_append_a_step_for_the_whole_batch_and_grow():
    seqs = SlotSequences(3)
    seqs.start(0, [1, 2, 3], prompt_len=2)
    seqs.start(2, list(range(63)), prompt_len=63)
    tokens = np.array([[7, 8, -1], [9, 9, 9], [5, -1, -1]])
    for _ in range(3):  # slot 1 holds no request: its tokens are not taken; slot 2 grows past 64
        seqs.append(tokens, np.array([2, 3, 1]))
    assert seqs.tokens(0).tolist() == [1, 2, 3, 7, 8, 7, 8, 7, 8]
    assert seqs.buf.shape[1] > 64  # (it started at 64 columns)
    assert seqs.tokens(2).tolist() == [*range(63), 5, 5, 5] and seqs.tokens(1).size == 0
    assert seqs.drop(0).tolist() == [3, 7, 8, 7, 8, 7, 8] and seqs.drop(0) is None
