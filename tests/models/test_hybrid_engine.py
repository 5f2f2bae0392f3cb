"""Speculation on hybrid models through the engine: the linear-attention states are rolled back
exactly on rejected drafts.

On tiny transformers-built Qwen3-Next and Qwen3.5 folders (random weights: the MTP layer's drafts
are rejected; the suffix drafter's, for prompts whose answers it has seen, accepted, so a batch
mixes acceptance), every speculative configuration gives the tokens plain decoding gives, greedy and
seeded, over a batch with staggered arrivals and chunked prefill (chunks that end inside a
prompt carry the state to the next step), and plain decoding gives transformers' greedy tokens.
The controls: with the rollback disabled (each slot keeps the state after its last draft) the
outputs change; and the drafts were neither all accepted nor all rejected.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.engine_args import build_config
from fastdeploy_mtp.models import load_model
from fastdeploy_mtp.models.linear_state import LinearStates
from fastdeploy_mtp.runtime.engine_metrics import Metrics
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.support.hf_hybrid_folders import HybridReference, make_hybrid_folder

MAX_TOKENS = 20
MTP = {"method": "mtp", "num_model_steps": 1}


def prompts() -> list[list[int]]:
    """Prompts of 5 to 90 tokens: random ones, and repetitive ones the n-gram drafter can
    continue; one longer than the delta rule's 64-token chunk."""
    rng = np.random.default_rng(7)
    loop = [11, 57, 203, 98] * 12
    return [
        rng.integers(3, 300, 9).tolist(),
        loop,
        rng.integers(3, 300, 90).tolist(),
        [5, 6, 7, 8, 9],
        loop[:30] + rng.integers(3, 300, 20).tolist(),
    ]


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5"])
def folder(request, tmp_path_factory):
    return make_hybrid_folder(tmp_path_factory.mktemp(request.param), request.param, layers=4)


def run(folder, spec: dict, sampled: bool = False, chunk: int = 16) -> tuple[list, object]:
    """Every prompt's tokens under ``spec`` (arrivals staggered over the first steps, at most
    3 slots, prompts prefilled in chunks of ``chunk``), and the engine's metrics. The engine
    first answers three of the prompts alone (greedy), so that the suffix drafter has seen
    their answers: its drafts for those are accepted, for the others mostly not."""
    target, mtp, arch = load_model(folder)
    cfg = build_config(arch, SpeculativeConfig.from_dict(dict(spec)), 3, 256)
    eng = build_engine(cfg, target, mtp if cfg.speculative_config.uses_mtp else None, chunk)
    eng.generate([Request(f"warm{i}", p, MAX_TOKENS) for i, p in enumerate(prompts()[:3])])
    eng.metrics = Metrics.for_drafts(len(eng.metrics.proposed), cfg.speculative_config.method)
    reqs = []
    for i, p in enumerate(prompts()):
        params = SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i) if sampled else None
        reqs.append(
            Request(f"r{i}", p, MAX_TOKENS, arrival_step=2 * i, sampling=params or SamplingParams())
        )
    eng.generate(reqs)
    eng.close()
    assert all(r.error is None for r in reqs), [r.error for r in reqs]
    return [list(r.output_token_ids) for r in reqs], eng.metrics


CASES = {
    "mtp-k1": {**MTP, "num_speculative_tokens": 1},
    "mtp-k2": {**MTP, "num_speculative_tokens": 2, "num_model_steps": 2},
    "mtp-k3-ngram": {**MTP, "num_speculative_tokens": 3, "mtp_strategy": "with_ngram"},
    "ngram-k3": {"method": "ngram", "num_speculative_tokens": 3},
    "suffix-k3": {"method": "suffix", "num_speculative_tokens": 3},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_speculation_equals_plain_decoding(folder, case):
    want, _ = run(folder, {"method": None})
    got, metrics = run(folder, CASES[case])
    assert got == want
    assert int(metrics.proposed.sum()) > 0  # drafts were verified: the rollback ran


def test_acceptance_is_mixed_in_the_batch(folder):
    """With the suffix drafter the batch sees every outcome: rounds with no draft accepted and
    rounds with all three, so the rollback picked every snapshot row."""
    _, metrics = run(folder, CASES["suffix-k3"])
    proposed, accepted = metrics.proposed, metrics.accepted
    assert 0 < accepted[0] < proposed[0] and accepted[2] > 0, (proposed, accepted)


def test_seeded_sampling_with_speculation_equals_plain_sampling(folder):
    want, _ = run(folder, {"method": None}, sampled=True)
    got, _ = run(folder, {**CASES["mtp-k3-ngram"], "verify_strategy": "target_match"}, True)
    assert got == want


def test_without_the_rollback_the_outputs_change(folder, monkeypatch):
    want, _ = run(folder, {"method": None})
    monkeypatch.setattr(LinearStates, "commit", lambda self, accept_num, verified: None)
    for case in ("mtp-k3-ngram", "suffix-k3"):
        got, _ = run(folder, CASES[case])
        assert got != want, case


def test_plain_decoding_equals_transformers_greedy(folder):
    ref = HybridReference(folder)
    ours, _ = run(folder, {"method": None}, chunk=0)
    import torch

    for prompt, tokens in list(zip(prompts(), ours))[:3]:
        with torch.no_grad():
            out = ref.target.generate(
                torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False
            )
        theirs = out[0, len(prompt) :].tolist()
        assert tokens == theirs[: len(tokens)] and len(tokens) in (len(theirs), MAX_TOKENS)
