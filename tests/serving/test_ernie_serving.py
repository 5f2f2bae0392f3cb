"""An ERNIE-4.5 MoE folder (interleaved RoPE, softmax router with ``moe_statics``, its MTP layer
under the released ``mtp_*`` names) served end to end.

* ``serve DIR`` with MTP (K = 1) at tensor-parallel size 2 (every expert split over the
  ranks) and chunked prefill (8 tokens a chunk): six token-id prompts of 3 to 44 tokens
  (across the 16-token KV block boundary), sent at once, each give transformers' own
  ``generate(use_mtp=True)``'s tokens and its drafts, round for round (``draft_logprobs``).
* A prefill + decode pair hands over every cache (3 target layers + 1 MTP layer) and the
  request's tokens are transformers' greedy ones; through the router a text prompt answers
  what the TP 2 server answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastdeploy_mtp.checks.reference import Reference
from tests.support import folder_serving as fs
from tests.support.folder_serving import folder_fixtures
from tests.support.handover import handed_over_every_cache
from tests.support.hf_ernie_folders import make_ernie_folder
from tests.support.served_drafts import check_family_drafts_served, fidelity_prompts
from tests.support.servers import (
    ServerProcess,
    http_post,
    splitwise_instances,
    splitwise_router,
)
from tests.support.tokenizer_files import write_bpe_tokenizer

MTP = '{"method": "mtp", "num_speculative_tokens": 1}'
TEXT = "The quick brown fox"


def write_folder(out: Path) -> None:
    """A tiny random ERNIE-4.5 MoE folder with echoed values and a byte-level BPE tokenizer."""
    make_ernie_folder(out, moe=True, echo=True)
    write_bpe_tokenizer(str(out), 300)


folder, tokenizer = folder_fixtures("ernie45-moe", write_folder)


@pytest.fixture(scope="module")
def reference(folder: str) -> Reference:
    return Reference(folder)


server = fs.tp2_server_fixture(MTP, "--prefill-chunk-size", "8", "--max-num-seqs", "6")


def test_serve_at_tp2_drafts_equal_transformers_round_for_round(
    server: ServerProcess, folder: str, reference: Reference
) -> None:
    check_family_drafts_served(server.base_url, folder, k=1, label="ernie45-moe TP2", ref=reference)


@pytest.fixture(scope="module")
def pd(folder: str) -> Iterator[list[ServerProcess]]:
    with splitwise_instances(
        ("prefill", MTP, "--model", folder),
        ("decode", MTP, "--model", folder, "--kv-transport", "shm"),
    ) as instances:
        yield instances


def test_prefill_decode_hands_over_every_cache_and_gives_transformers_tokens(
    pd: list[ServerProcess],
    server: ServerProcess,
    folder: str,
    reference: Reference,
    tokenizer: Any,
) -> None:
    prefill, decode = pd
    for i, prompt in enumerate(fidelity_prompts()[3:5]):  # 16 tokens (a whole block) and 17
        ids = handed_over_every_cache(
            prefill.base_url,
            decode.base_url,
            f"ernie-hand-over-{i}",
            prompt,
            target_layers=3,
            mtp_layers=1,
            tensor_parallel_size=1,
            max_tokens=16,
        )
        assert ids == reference.greedy(prompt, 16), i
    body = {"model": folder, "prompt": TEXT, "max_tokens": 16, "temperature": 0}
    status, want = http_post(server.base_url + "/v1/completions", body)
    assert status == 200, want
    with splitwise_router(prefill, decode, tokenizer=tokenizer) as url:
        # the router names its model after no folder (splitwise_router's default name)
        status, got = http_post(url + "/v1/completions", {**body, "model": "fastdeploy-mtp-tiny"})
    assert status == 200, got
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
