"""K = 8 (``MAX_NUM_SPECULATIVE_TOKENS``, the longest draft any command accepts) end to end on
the shipped checkpoint, in process: every drafting method (one MTP substep + n-gram, eight
MTP substeps, n-gram, suffix) emits exactly the tokens of plain decoding, greedy and seeded,
and really offers drafts at position 8."""

from __future__ import annotations

import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.capacity import build_config
from fastdeploy_mtp.config import MAX_NUM_SPECULATIVE_TOKENS, SpeculativeConfig
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams

K = MAX_NUM_SPECULATIVE_TOKENS
TOK = ByteTokenizer()
#: the configs under test, by id (``num_speculative_tokens`` K added)
CONFIGS = {
    "mtp-s1-ngram": {"method": "mtp", "num_model_steps": 1, "mtp_strategy": "with_ngram"},
    "mtp-s8": {"method": "mtp", "num_model_steps": K},
    "ngram": {"method": "ngram"},
    "suffix": {"method": "suffix"},
}
SAMPLING = {
    "greedy": SamplingParams(),
    "seeded": SamplingParams(temperature=0.8, top_p=0.9, seed=7),
}


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def generate(shipped, spec: SpeculativeConfig, sampling: SamplingParams):
    """The tokens of 4 demo prompts, 40 new tokens each, in one batch; and the engine."""
    target, mtp, arch = shipped
    reqs = [
        Request(
            f"p{i}",
            TOK.encode(prompt),
            max_tokens=40,
            sampling=SamplingParams.from_dict(sampling.to_dict()),
        )
        for i, prompt in enumerate(DEMO_PROMPTS[:4])
    ]
    engine = build_engine(build_config(arch, spec, 4, 512), target, mtp if spec.uses_mtp else None)
    out = engine.generate(reqs)
    engine.close()
    return out, engine


@pytest.fixture(scope="module")
def plain(shipped):
    """Plain decoding's tokens, per sampling kind."""
    off = SpeculativeConfig(method=None)
    return {name: generate(shipped, off, s)[0] for name, s in SAMPLING.items()}


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_eight_drafts_emit_the_tokens_of_plain_decoding(shipped, plain, config, sampling):
    spec = SpeculativeConfig.from_dict({**CONFIGS[config], "num_speculative_tokens": K})
    out, engine = generate(shipped, spec, SAMPLING[sampling])
    assert out == plain[sampling]
    m = engine.metrics
    assert len(m.proposed) == K and m.proposed[K - 1] > 0, m.as_dict()
    assert m.accepted.sum() > 0, m.as_dict()


def test_more_than_eight_drafts_are_refused_with_the_key_named():
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be <= 8, got 9"):
        SpeculativeConfig(method="mtp", num_speculative_tokens=9)
