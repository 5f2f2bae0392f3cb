"""``min_tokens`` holds back the stop token ids as it holds back EOS (vLLM's meaning; a served
model's EOS ids reach the engine as stop ids), with and without speculation."""

from __future__ import annotations

import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.engine_args import build_config, speculative_config
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams

TOK = ByteTokenizer()
PROMPT = TOK.encode("def read_lines(path):\n    with open(path) as f:\n        ")


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def generate(shipped, k: int, sampling: SamplingParams, max_tokens: int = 12) -> list[int]:
    target, mtp, arch = shipped
    spec = speculative_config(k)
    cfg = build_config(arch, spec, 2, len(PROMPT) + max_tokens + 16)
    with build_engine(cfg, target, mtp if spec.enabled else None) as engine:
        return engine.generate([Request("r", PROMPT, max_tokens, sampling=sampling)])["r"]


@pytest.mark.parametrize("k", [0, 3])
def test_min_tokens_holds_back_stop_ids(shipped, k):
    free = generate(shipped, 0, SamplingParams())
    stop = free[1]  # the greedy run's second token
    first = free.index(stop)
    # without min_tokens the stop id ends the output where it first appears (kept, like EOS)
    assert generate(shipped, k, SamplingParams(stop_token_ids=[stop])) == free[: first + 1]
    held = generate(shipped, k, SamplingParams(stop_token_ids=[stop], min_tokens=6))
    assert stop not in held[:6], held
    # the ban changes the logits, not the rest: speculation gives the same tokens as none
    assert held == generate(shipped, 0, SamplingParams(stop_token_ids=[stop], min_tokens=6))
    # sampled and seeded: the same with and without speculation, the stop id held back too
    seeded = SamplingParams(temperature=0.9, seed=5, stop_token_ids=[stop], min_tokens=6)
    out = generate(shipped, k, seeded)
    assert stop not in out[:6] and out == generate(shipped, 0, seeded)
