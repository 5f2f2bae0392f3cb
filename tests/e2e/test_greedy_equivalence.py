"""Greedy equivalence: with MTP speculation (any K, any number of MTP substeps, with or
without the n-gram hybrid, any batch mix, chunked prefill, stops, slot reuse) the engine
generates exactly the tokens it generates without speculation."""

from __future__ import annotations

import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.models import greedy_generate
from tests.support.engines import EOS, make_config, make_requests


def run(model, cfg, requests, chunk=0, trace=False):
    target, mtp = model
    engine = build_engine(
        cfg,
        target,
        mtp if cfg.speculative_config.enabled else None,
        prefill_chunk_size=chunk,
        record_trace=trace,
    )
    return engine.generate(requests), engine


def test_baseline_engine_matches_plain_greedy_decoding(random_model):
    """The non-speculative engine is greedy decoding, up to and including the token that
    reaches ``max_tokens`` (the runner keeps it: FastDeploy's ops would emit the first EOS
    id there). The random model's EOS id lies in the padded vocabulary, never generated."""
    target, _ = random_model
    reqs = make_requests(7, 3)
    out, _ = run(random_model, make_config(0), reqs)
    for r in reqs:
        want = greedy_generate(target, r.prompt_token_ids, r.max_tokens)
        assert EOS not in want
        assert out[r.request_id] == want, r.request_id


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
    (8, 8, False, 5, 7),
    (8, 2, True, 5, 0),
]


@pytest.mark.parametrize("k,steps,hybrid,batch,chunk", CASES)
def test_speculative_tokens_equal_non_speculative_tokens(
    random_model, k, steps, hybrid, batch, chunk
):
    count = max(batch, 6) if batch > 1 else 3
    base, _ = run(
        random_model, make_config(0, max_num_seqs=batch), make_requests(11, count), chunk=chunk
    )
    spec, engine = run(
        random_model,
        make_config(k, steps, hybrid, max_num_seqs=batch),
        make_requests(11, count),
        chunk=chunk,
    )
    assert spec == base
    assert engine.metrics.target_forwards > 0 and engine.metrics.decode_item_steps > 0


def test_slots_are_reused_by_later_requests(random_model):
    reqs = make_requests(5, 7, stagger=0)
    spec, engine = run(random_model, make_config(2, max_num_seqs=2), reqs)
    base, _ = run(random_model, make_config(0, max_num_seqs=2), make_requests(5, 7, stagger=0))
    assert spec == base
    assert sorted({r.idx for r in reqs}) == [0, 1]  # seven requests through two slots


ADAPTIVE_CASES = [
    # (K, steps, hybrid, batch, chunk, threshold, probe interval)
    (3, 3, False, 5, 0, 0.3, 2),
    (3, 1, True, 5, 7, 0.3, 2),
    (2, 2, False, 16, 0, 0.9, 1),
    (3, 3, False, 1, 0, 1.0, 3),
    (8, 8, False, 5, 0, 0.3, 2),
]


@pytest.mark.parametrize("k,steps,hybrid,batch,chunk,threshold,interval", ADAPTIVE_CASES)
def test_adaptive_draft_length_keeps_greedy_equivalence(
    random_model, k, steps, hybrid, batch, chunk, threshold, interval
):
    """Drafts shrink to 0 (the random MTP layer is rarely right), rounds skip the MTP layer,
    probes bring it back: the tokens stay those of plain decoding."""
    count = max(batch, 6) if batch > 1 else 3
    base, _ = run(
        random_model, make_config(0, max_num_seqs=batch), make_requests(11, count), chunk=chunk
    )
    cfg = make_config(k, steps, hybrid, max_num_seqs=batch)
    spec = cfg.speculative_config
    spec.adaptive_draft_length = True
    spec.acceptance_rate_threshold = threshold
    spec.adaptive_probe_interval = interval
    out, engine = run(random_model, cfg, make_requests(11, count), chunk=chunk)
    assert out == base
    m = engine.metrics
    assert engine.runner.adaptive is not None
    assert m.proposed.sum() < k * m.decode_item_steps, "the draft length never shrank"


@pytest.mark.parametrize("schedule", ["cycle", "repeat_last", "first"])
@pytest.mark.parametrize(
    "k,steps,hybrid,batch", [(3, 3, False, 5), (3, 2, True, 5), (2, 2, False, 1)]
)
def test_distinct_mtp_layers_keep_greedy_equivalence(
    random_model, schedule, k, steps, hybrid, batch
):
    """A checkpoint with 3 distinct MTP layers (random weights), each with its own cache."""
    from fastdeploy_mtp.models.mtp_layer import MTPStack

    target, _ = random_model
    arch = type(target.config).from_dict({**target.config.to_dict(), "num_nextn_predict_layers": 3})
    stack = MTPStack(arch, target)
    stack.eval()
    count = max(batch, 6) if batch > 1 else 3
    base, _ = run(
        random_model, make_config(0, max_num_seqs=batch), make_requests(13, count), chunk=7
    )
    cfg = make_config(k, steps, hybrid, max_num_seqs=batch)
    cfg.speculative_config.mtp_layer_schedule = schedule
    out, engine = run((target, stack), cfg, make_requests(13, count), chunk=7)
    assert out == base
    assert len(engine.runner.proposer.caches) == 6
