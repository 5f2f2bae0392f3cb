"""The model-free drafting methods (``"ngram"``, ``"suffix"``, ``"naive"``) through the
proposer interface: their config keys, aliases and refusals; greedy and seeded output equal
to no speculation (drafts only change speed under ``target_match``); the suffix trie's
incremental updates equal a build from scratch; suffix drafts pay on a repetitive prompt."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from fastdeploy_mtp.config import FDConfig, SchedulerConfig, SpeculativeConfig, SpeculativeConfigError
from fastdeploy_mtp.engine_args import build_config
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.proposer.model_free import NaiveProposer, NgramProposer
from fastdeploy_mtp.proposer.suffix import Cursor, SuffixCache, SuffixProposer, SuffixTrie
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.engine import Engine
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
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
    spec = SpeculativeConfig.from_dict({"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 1})
    assert (spec.max_ngram_size, spec.min_ngram_size) == (4, 1)
    same = SpeculativeConfig.from_dict({"method": "ngram", "prompt_lookup_max": 4, "max_ngram_size": 4})
    assert same.max_ngram_size == 4
    for alias, key in (("prompt_lookup_max", "max_ngram_size"), ("prompt_lookup_min", "min_ngram_size")):
        with pytest.raises(SpeculativeConfigError, match=f"'{alias}' .*'{key}'"):
            SpeculativeConfig.from_dict({"method": "ngram", alias: 3, key: 2})


@pytest.mark.parametrize(
    "values,words",
    [
        ({"method": "eagle"}, "method must be one of"),
        ({"method": "suffix", "adaptive_draft_length": True}, "adaptive_draft_length needs method 'mtp'"),
        ({"method": "ngram", "mtp_strategy": "with_ngram"}, "mtp_strategy 'with_ngram' needs method 'mtp'"),
        ({"method": "suffix", "suffix_decoding_min_token_prob": 1.5}, "suffix_decoding_min_token_prob"),
        ({"method": "suffix", "suffix_decoding_max_tree_depth": 0}, "suffix_decoding_max_tree_depth"),
        ({"method": "suffix", "suffix_decoding_max_spec_factor": 0.0}, "suffix_decoding_max_spec_factor"),
        ({"method": "suffix", "suffix_decoding_max_cached_requests": -1}, "suffix_decoding_max_cached_requests"),
        ({"method": "suffix", "suffix_decoding_max_cached_requests": 1.5}, "suffix_decoding_max_cached_requests"),
    ],
)
def test_bad_method_configs_are_refused_naming_the_key(values, words):
    with pytest.raises(SpeculativeConfigError, match=words):
        SpeculativeConfig.from_dict(values)


@pytest.mark.parametrize("method", ["ngram", "suffix", "naive"])
def test_model_free_methods_are_refused_on_splitwise_instances(method):
    spec = SpeculativeConfig.from_dict({"method": method})
    with pytest.raises(ValueError, match=f"method '{method}' is not supported with splitwise_role 'prefill'"):
        FDConfig(speculative_config=spec, scheduler_config=SchedulerConfig(splitwise_role="prefill"))
    FDConfig(
        speculative_config=SpeculativeConfig.from_dict({"method": "mtp"}),
        scheduler_config=SchedulerConfig(splitwise_role="decode"),
    )


# ---- greedy equality (random model) -----------------------------------------------------------
def run(model, cfg, requests, chunk):
    target, mtp = model
    engine = Engine(cfg, target, mtp, prefill_chunk_size=chunk)
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
