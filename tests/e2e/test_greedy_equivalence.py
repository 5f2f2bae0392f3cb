"""Greedy equivalence: with MTP speculation (any K, any number of MTP substeps, with or
without the n-gram hybrid, any batch mix, chunked prefill, stops, slot reuse) the engine
generates exactly the tokens it generates without speculation."""

from __future__ import annotations

import pytest

from fastdeploy_mtp.models import greedy_generate
from fastdeploy_mtp.runtime.engine import Engine
from tests.engine_testlib import EOS, make_config, make_requests


def run(model, cfg, requests, chunk=0, trace=False):
    target, mtp = model
    engine = Engine(
        cfg, target, mtp if cfg.speculative_config.enabled else None, prefill_chunk_size=chunk, record_trace=trace
    )
    return engine.generate(requests), engine


def test_baseline_engine_matches_plain_greedy_decoding(random_model):
    """The non-speculative engine is greedy decoding; at max_tokens the last token is
    replaced by the first EOS id, as FastDeploy's update op does."""
    target, _ = random_model
    reqs = make_requests(7, 3)
    out, _ = run(random_model, make_config(0), reqs)
    for r in reqs:
        want = greedy_generate(target, r.prompt_token_ids, r.max_tokens)
        got = out[r.request_id]
        assert got[:-1] == want[:-1], r.request_id
        assert got[-1] in (want[-1], EOS)
        assert len(got) == r.max_tokens


CASES = [
    # (K, steps, hybrid, batch, chunk)
    (1, 1, False, 1, 0),
    (2, 1, False, 5, 0),
    (2, 2, False, 5, 7),
    (3, 1, False, 5, 64),
    (3, 3, False, 16, 0),
    (3, 1, True, 5, 0),
    (3, 3, True, 5, 7),
    (2, 1, True, 16, 7),
]


@pytest.mark.parametrize("k,steps,hybrid,batch,chunk", CASES)
def test_speculative_tokens_equal_non_speculative_tokens(random_model, k, steps, hybrid, batch, chunk):
    count = max(batch, 6) if batch > 1 else 3
    base, _ = run(random_model, make_config(0, max_num_seqs=batch), make_requests(11, count), chunk=chunk)
    spec, engine = run(
        random_model, make_config(k, steps, hybrid, max_num_seqs=batch), make_requests(11, count), chunk=chunk
    )
    assert spec == base
    assert engine.metrics.target_forwards > 0 and engine.metrics.decode_item_steps > 0


def test_slots_are_reused_by_later_requests(random_model):
    reqs = make_requests(5, 7, stagger=0)
    spec, engine = run(random_model, make_config(2, max_num_seqs=2), reqs)
    base, _ = run(random_model, make_config(0, max_num_seqs=2), make_requests(5, 7, stagger=0))
    assert spec == base
    assert sorted({r.idx for r in reqs}) == [0, 1]  # seven requests through two slots
