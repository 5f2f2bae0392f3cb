"""A DeepSeek-V3 folder (multi-head latent attention, MoE, one MTP layer) served end to end:
``generate --json`` gives transformers' greedy tokens; ``serve DIR`` with MTP at tensor-parallel
size 2 publishes one latent cache per layer on every rank and answers exactly as ``generate``;
a prefill + decode pair hands over every latent cache (2 target + 1 MTP) and the decode
instance's tokens continue ``generate``'s."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import folder_serving as fs
from tests.support.handover import handed_over_every_cache
from tests.support.hf_mla_folders import make_mla_folder, mla_reference_greedy
from tests.support.served_drafts import check_family_drafts_served
from tests.support.servers import ServerProcess, splitwise_instances, splitwise_router
from tests.support.tokenizer_files import write_bpe_tokenizer

pytest.importorskip("openai")

folder, tokenizer = fs.folder_fixtures(
    "deepseek-v3",
    lambda out: make_mla_folder(out, yarn=True, tokenizer_writer=write_bpe_tokenizer),
)


#: ``generate(prompt)``: ``fastdeploy-mtp generate --json`` greedy with MTP, parsed
generate = fs.generate_fixture(fs.K2_MTP, fs.K2_MAX_TOKENS, "--temperature", "0")


def test_generate_gives_transformers_greedy_tokens(
    folder: str, tokenizer: Any, generate: fs.Generate
) -> None:
    greedy = functools.partial(mla_reference_greedy, folder, n=fs.K2_MAX_TOKENS)
    fs.check_generate_equals_reference(generate, tokenizer, fs.K2_PROMPTS, greedy, eos=2)


server = fs.tp2_server_fixture(fs.K2_MTP)


def test_serve_at_tp2_publishes_latent_caches_and_equals_generate(
    server: ServerProcess, folder: str, tokenizer: Any, generate: fs.Generate
) -> None:
    log = server.output()
    for rank in range(2):
        assert f"rank {rank}: 3 KV caches published (2 target + 1 MTP, float32," in log, log
    fs.check_greedy_equals_generate(
        server.base_url, folder, fs.K2_PROMPTS, fs.K2_MAX_TOKENS, generate
    )


@pytest.fixture(scope="module")
def pd(folder: str) -> Iterator[list[ServerProcess]]:
    with splitwise_instances(
        ("prefill", fs.K2_MTP, "--model", folder),
        ("decode", fs.K2_MTP, "--model", folder, "--kv-transport", "shm"),
        ("decode", fs.K2_MTP, "--model", folder, "--kv-transport", "tcp"),
    ) as instances:
        yield instances


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_prefill_decode_equals_generate_and_hands_over_every_latent_cache(
    pd: list[ServerProcess], tokenizer: Any, generate: fs.Generate, transport: str
) -> None:
    prefill, shm, tcp = pd
    decode = shm if transport == "shm" else tcp
    with splitwise_router(prefill, decode, tokenizer=tokenizer) as url:
        # the router names its model after no folder (splitwise_router's default name)
        fs.check_greedy_equals_generate(
            url, "fastdeploy-mtp-tiny", fs.K2_PROMPTS, fs.K2_MAX_TOKENS, generate
        )
    prompt = fs.K2_PROMPTS[0]
    want = generate(prompt)["token_ids"]
    ids = handed_over_every_cache(
        prefill.base_url,
        decode.base_url,
        f"mla-hand-over-{transport}",
        tokenizer.encode(prompt),
        target_layers=2,
        mtp_layers=1,
        tensor_parallel_size=1,
        max_tokens=len(want),
        kinds=("latent",),
    )
    assert ids == want


def test_serve_at_tp2_drafts_equal_the_chained_reference_round_for_round(
    server: ServerProcess, folder: str
) -> None:
    """K = 2 through the TP 2 server: every round's tokens and drafts equal transformers' MTP
    layer chained by the rule the engine states for DeepSeek-V3 (substep 2 fed the block's
    output before the final norm)."""
    check_family_drafts_served(server.base_url, folder, k=2, label="deepseekv3 TP2")
