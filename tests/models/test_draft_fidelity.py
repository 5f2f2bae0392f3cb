"""The engine's drafts against transformers, round for round, for every family with MTP layers.

Through the engine ``fastdeploy-mtp generate`` runs (``run_requests``: folder loading,
tokenizer, EOS ids, scheduler, MTP proposer, ops), greedy, 6 prompts of 3 to 44 tokens (across
the 16-token KV block boundary), 32 tokens each, batched four at a time:

* K = 1: every round's emitted tokens and draft equal transformers' own
  ``generate(use_mtp=True)`` (its MTP candidate generator, drafts recorded per round);
* K = 2 (one MTP layer reused): equal to the reference chained out of transformers' MTP layer by
  the rule the engine states per family (DeepSeek-V3 / GLM-4.5: substep 2 is fed the block's
  output before the final norm; the others after it), with chunked prefill on and off.

The fixtures carry what has hidden bugs before: router correction biases that make biased
scores negative with group-limited routing over two groups (DeepSeek-V3, GLM-4.5), partial
rotary, q/k/v biases, a non-square ``o_proj``, q/k norm on and off, MLA, a padded vocabulary
(tokenizer 280 ids, model 300) and an unpadded one whose last id is an ordinary token, MTP
layers reshaped so that drafts are accepted in some rounds (``echo``).
"""

from __future__ import annotations

import pytest

# transformers (and torch) are test dependencies (`.[test]`): the comparison must run, never skip
import transformers  # noqa: F401

from fastdeploy_mtp.checks.drafts import compare
from fastdeploy_mtp.checks.reference import Reference
from fastdeploy_mtp.entrypoints.check_drafts import engine_rounds
from tests.support.fidelity_cases import CASES, fidelity_prompts

MAX_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    path = str(CASES[request.param](tmp_path_factory.mktemp(request.param)))
    return request.param, path, Reference(path), fidelity_prompts()


def _check(name, run, want, k):
    for i, (ours, theirs) in enumerate(zip(run.rounds, want)):
        c = compare(ours, theirs)
        assert c.tokens_equal, f"{name} K={k} prompt {i}: tokens differ from transformers'"
        assert c.first_diff is None, (
            f"{name} K={k} prompt {i}: round {c.first_diff} differs: ours {c.ours}, reference "
            f"{c.theirs}"
        )


def test_k1_rounds_equal_transformers_generate_use_mtp(case):
    name, path, ref, prompts = case
    run = engine_rounds(path, prompts, MAX_TOKENS, 1)
    assert run.prompt_ids == prompts
    want = [ref.generate_rounds(p, MAX_TOKENS, 1, stop_ids=run.stop_ids) for p in prompts]
    _check(name, run, want, 1)
    assert sum(len(r) for r in want) > 6 * 8  # the requests ran on (no early EOS everywhere)
    if name == "glm45-echo-negbias":  # drafts accepted in some rounds, rejected in others
        decode = [r for rounds in want for r in rounds[1:]]
        assert any(len(r.tokens) == 2 for r in decode) and any(len(r.tokens) == 1 for r in decode)


@pytest.mark.parametrize("chunk", [0, 8])
def test_k2_rounds_equal_the_chained_reference(case, chunk):
    name, path, ref, prompts = case
    run = engine_rounds(path, prompts, MAX_TOKENS, 2, prefill_chunk_size=chunk)
    want = [ref.chained_rounds(p, MAX_TOKENS, 2, stop_ids=run.stop_ids) for p in prompts]
    _check(name, run, want, 2)


def test_padded_ids_are_never_produced(case):
    name, path, ref, prompts = case
    if ref.vocab == ref.vocab_size:
        assert name.endswith("unpadded") or "padded" not in name
        return
    run = engine_rounds(path, prompts[:2], MAX_TOKENS, 1)
    produced = {t for rounds in run.rounds for r in rounds for t in (*r.tokens, *r.drafts)}
    assert produced and max(produced) < ref.vocab
