"""Qwen3-Next and Qwen3.5 folders through the commands users run: ``generate`` with MTP equals
``generate`` without and transformers' greedy tokens; ``serve`` at tensor-parallel size 2 (the
cache manager creates the linear-attention states, each worker attaches its half of the heads by
name) answers greedy completions as ``generate`` does, speculating; prefix caching is off for
these models, and asking for it, or for a splitwise role, is a usage error naming the model."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.folder_serving import (
    check_generate_equals_reference,
    check_greedy_equals_generate,
    folder_fixtures,
    json_generator,
    run_cli,
)
from tests.support.hf_hybrid_folders import HybridReference, make_hybrid_folder
from tests.support.servers import ServerProcess, device_ids, serving
from tests.support.tokenizer_files import write_bpe_tokenizer

MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "mtp_strategy": "with_ngram"}'
PLAIN = '{"method": null}'
PROMPTS = ["def add(a, b):", "The harbor master wrote down every ship that came in"]
MAX_TOKENS = 16


def _qwen3_next(out: Path) -> None:
    make_hybrid_folder(out, "qwen3_next", layers=4)
    write_bpe_tokenizer(str(out), 300)


def _qwen3_5(out: Path) -> None:
    make_hybrid_folder(out, "qwen3_5", layers=4)
    write_bpe_tokenizer(str(out), 300)


folder, tokenizer = folder_fixtures("qwen3_next", _qwen3_next)


@pytest.fixture(scope="module")
def server(folder: str) -> Iterator[ServerProcess]:
    args = [folder, "--speculative-config", MTP3, "--tensor-parallel-size", "2"]
    yield from serving(args)


def test_generate_with_mtp_equals_plain_and_transformers(folder, tokenizer):
    spec, plain = (
        json_generator(folder, MTP3, MAX_TOKENS),
        json_generator(folder, PLAIN, MAX_TOKENS),
    )
    for prompt in PROMPTS:
        assert spec(prompt)["token_ids"] == plain(prompt)["token_ids"], prompt
    ref = HybridReference(folder)

    def greedy(ids: list[int]) -> list[int]:
        import torch

        with torch.no_grad():
            out = ref.target.generate(
                torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False
            )
        return out[0, len(ids) :].tolist()

    check_generate_equals_reference(spec, tokenizer, PROMPTS, greedy, eos=2)


def test_qwen3_5_generate_with_mtp_equals_plain(tmp_path):
    _qwen3_5(tmp_path)
    spec = json_generator(str(tmp_path), MTP3, MAX_TOKENS)
    plain = json_generator(str(tmp_path), PLAIN, MAX_TOKENS)
    for prompt in PROMPTS:
        assert spec(prompt)["token_ids"] == plain(prompt)["token_ids"], prompt


def test_tp2_server_answers_as_generate_with_states_from_the_cache_manager(folder, server):
    check_greedy_equals_generate(
        server.base_url, folder, PROMPTS, MAX_TOKENS, json_generator(folder, PLAIN, MAX_TOKENS)
    )
    log = server.output()
    assert "prefix caching off" in log, log
    assert "linear-attention state tensors" in log, log  # the cache manager's line


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--enable-prefix-caching"], "--enable-prefix-caching: .* has linear-attention layers"),
        (["--splitwise-role", "prefill"], "--splitwise-role prefill: .* has linear-attention"),
    ],
)
def test_prefix_caching_and_splitwise_are_refused_naming_the_model(folder, flags, message):
    # device ids of its own: device 0's KV cache names may belong to another server here
    args = ["serve", folder, "--speculative-config", MTP3, "--device-ids", device_ids(1)]
    code, _, err = run_cli([*args, *flags])
    assert code == 2 and re.search(message, err), err
