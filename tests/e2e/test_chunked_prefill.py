"""Chunked prefill changes nothing a request gets: tokens equal and logprobs within 1e-5 for
every prefill chunk size (1, 3, 7, 16 and the whole prompt), with repetition, frequency and
presence penalties and ``min_tokens``, under every sampling verify strategy, with and without
speculation.

A non-final prompt chunk runs through the verify and update ops like any step and emits a
throw-away token, which the runner undoes (``TargetRunner._fix_up_non_final_chunks``). That
token used to stay in the slot's history (``token_ids_all`` at the first generated position),
where the penalty op counted it as generated when it penalised the final chunk's row: the
first token's distribution then depended on how the prompt was split (and, through P/D, on
the prefill instance's token budget).

Logprobs are compared within 1e-5 (absolute, or relative where a logprob is below -1), not
bit for bit: a chunk's keys and values are computed by matrix products of another shape than
the whole prompt's, which moves float32 logits by a few units in the last place (a logprob of
-4.78 moved by 1.1e-5, 24 float32 steps, in this sweep).
"""

from __future__ import annotations

import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.engine_args import build_config, speculative_config
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams

TOK = ByteTokenizer()
PROMPTS = [
    "Every morning the engineer walked along the harbor and noticed",  # 62 tokens
    "def read_lines(path):\n    with open(path) as f:\n        for",
]
PARAMS = [
    SamplingParams(temperature=0.8, seed=3, logprobs=1, presence_penalty=0.5),
    SamplingParams(temperature=0.8, seed=4, logprobs=1, frequency_penalty=0.7, top_p=0.9),
    SamplingParams(temperature=0.7, seed=5, logprobs=2, repetition_penalty=1.4, min_tokens=3),
    SamplingParams(logprobs=1, repetition_penalty=1.3, presence_penalty=0.4),  # greedy, penalised
]
NO_PENALTY = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
CHUNKS = [1, 3, 7, 16, 0]  # 0: the whole prompt in one chunk
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def run(
    shipped, chunk: int, k: int, strategy: str, params=PARAMS
) -> dict[str, tuple[list[int], list]]:
    """Every prompt with every sampling set, batch 4, ``prefill_chunk_size`` ``chunk``."""
    target, mtp, arch = shipped
    spec = speculative_config(k, k if k else None, False)
    spec.verify_strategy = strategy
    cfg = build_config(arch, spec, 4, 256)
    eng = build_engine(cfg, target, mtp if k else None, prefill_chunk_size=chunk)
    reqs = [
        Request(
            f"p{i}s{j}",
            TOK.encode(prompt),
            MAX_TOKENS,
            sampling=SamplingParams.from_dict(sp.to_dict()),
        )
        for i, prompt in enumerate(PROMPTS)
        for j, sp in enumerate(params)
    ]
    eng.generate(reqs)
    eng.close()
    return {r.request_id: (r.output_token_ids, r.output_logprobs) for r in reqs}


def assert_same(got: dict, want: dict, context: str) -> None:
    assert got.keys() == want.keys()
    for rid, (tokens, logprobs) in want.items():
        assert got[rid][0] == tokens, f"{context}, {rid}: tokens differ"
        assert len(got[rid][1]) == len(logprobs) == MAX_TOKENS
        for i, (a, b) in enumerate(zip(got[rid][1], logprobs)):
            assert a.token_id == b.token_id
            assert a.logprob == pytest.approx(b.logprob, rel=1e-5, abs=1e-5), (
                f"{context}, {rid}, token {i}"
            )
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("k", [0, 2], ids=["no-spec", "mtp-k2"])
@pytest.mark.parametrize("strategy", ["target_match", "rejection", "topp"])
def test_every_chunk_size_gives_the_whole_prompt_s_tokens_and_logprobs(shipped, strategy, k):
    whole = run(shipped, 0, k, strategy)
    for chunk in CHUNKS[:-1]:
        assert_same(run(shipped, chunk, k, strategy), whole, f"chunk {chunk}, {strategy}, K={k}")
    if strategy == "target_match":  # seeded: speculation changes nothing either
        assert_same(
            whole, run(shipped, 0, 0, strategy), f"{strategy}, K={k} against no speculation"
        )


@pytest.mark.parametrize("chunk", CHUNKS)
def test_penalties_have_nothing_to_count_at_the_first_token(shipped, chunk):
    """The issue's case: with nothing generated yet, a penalised request's first token has the
    unpenalised distribution (``log_softmax(logits / T)``), whatever the chunk size."""
    penalised = run(shipped, chunk, 0, "target_match")
    plain_params = [SamplingParams.from_dict({**sp.to_dict(), **NO_PENALTY}) for sp in PARAMS]
    plain = run(shipped, 0, 0, "target_match", plain_params)
    for rid, (tokens, logprobs) in penalised.items():
        assert tokens[0] == plain[rid][0][0], rid
        assert logprobs[0].logprob == pytest.approx(plain[rid][1][0].logprob, rel=1e-5, abs=1e-5), (
            rid
        )
        assert [t for t, _ in logprobs[0].top] == [t for t, _ in plain[rid][1][0].top], rid
