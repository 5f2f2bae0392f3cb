"""Greedy equivalence: with MTP speculation (any K, any number of MTP substeps, with or
without the n-gram hybrid, any batch mix, chunked prefill, stops, slot reuse) the engine
generates exactly the tokens it generates without speculation."""

from __future__ import annotations

import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.models import greedy_generate
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
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
    # (K, steps, hybrid, batch, chunk, seeded, probe interval)
    (3, 3, False, 5, 0, False, 2),
    (3, 1, True, 5, 7, True, 2),
    (2, 2, False, 16, 0, False, 1),
    (3, 3, False, 1, 0, True, 3),
    (8, 1, True, 4, 0, False, 2),
    (8, 8, False, 5, 0, True, 2),
]


@pytest.mark.parametrize("k,steps,hybrid,batch,chunk,seeded,interval", ADAPTIVE_CASES)
def test_draft_planner_keeps_outputs_equal(
    random_model, k, steps, hybrid, batch, chunk, seeded, interval
):
    """The draft planner on (per-request methods: MTP, n-gram, suffix; 0 drafts; the MTP
    layer skipped and probed again): the tokens stay those of plain decoding, greedy and
    seeded (target_match)."""
    count = max(batch, 6) if batch > 1 else 3

    def requests():
        reqs = make_requests(11, count)
        for i, r in enumerate(reqs):
            if seeded:
                r.sampling = SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i)
        return reqs

    base, _ = run(random_model, make_config(0, max_num_seqs=batch), requests(), chunk=chunk)
    cfg = make_config(k, steps, hybrid, max_num_seqs=batch)
    spec = cfg.speculative_config
    spec.adaptive_draft_length = True
    spec.adaptive_probe_interval = interval
    out, engine = run(random_model, cfg, requests(), chunk=chunk)
    assert out == base
    m = engine.metrics
    assert engine.runner.planner is not None
    assert m.proposed.sum() < k * m.decode_item_steps, "every request always drafted all K"
    assert sum(v[0] for v in m.method_drafts.values()) == m.proposed.sum()


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
