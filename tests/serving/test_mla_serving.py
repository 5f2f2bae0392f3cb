"""A DeepSeek-V3 folder (multi-head latent attention, MoE, one MTP layer) served end to end:
``generate --json`` gives transformers' greedy tokens; ``serve DIR`` with MTP at tensor-parallel
size 2 publishes one latent cache per layer on every rank and answers exactly as ``generate``;
a prefill + decode pair hands over every latent cache (2 target + 1 MTP) and the decode
instance's tokens continue ``generate``'s."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fastdeploy_mtp.entrypoints.cli import main
from tests.support.handover import handed_over_every_cache
from tests.support.hf_mla_folders import make_mla_folder, mla_reference_greedy
from tests.support.served_drafts import check_family_drafts_served
from tests.support.servers import ServerProcess, serving, splitwise_instances, splitwise_router
from tests.support.tokenizer_files import write_bpe_tokenizer

openai = pytest.importorskip("openai")

MTP = '{"method": "mtp", "num_speculative_tokens": 2}'
MAX_TOKENS = 16
PROMPTS = ["Speculative decoding drafts", "The quick brown fox"]
Generate = Callable[[str], dict[str, Any]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("deepseek-v3")
    make_mla_folder(out, yarn=True, tokenizer_writer=write_bpe_tokenizer)
    return str(out)


@pytest.fixture(scope="module")
def tokenizer(folder: str) -> Any:
    from fastdeploy_mtp.tokenization import load_tokenizer

    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def generate(folder: str) -> Generate:
    """``generate(prompt)``: ``fastdeploy-mtp generate --json`` greedy with MTP, parsed (once each)."""
    done: dict[str, dict[str, Any]] = {}

    def run(prompt: str) -> dict[str, Any]:
        if prompt not in done:
            argv = [
                "generate",
                "--prompt",
                prompt,
                "--max-tokens",
                str(MAX_TOKENS),
                "--speculative-config",
                MTP,
            ]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main([*argv, "--temperature", "0", "--json", "--model", folder])
            assert code == 0, err.getvalue()
            done[prompt] = json.loads(out.getvalue())
        return done[prompt]

    return run


def test_generate_gives_transformers_greedy_tokens(
    folder: str, tokenizer: Any, generate: Generate
) -> None:
    for prompt in PROMPTS:
        ids = generate(prompt)["token_ids"]
        want = mla_reference_greedy(folder, tokenizer.encode(prompt), MAX_TOKENS)
        if 2 in want:  # the folder's EOS id ends the request (and is its last token)
            want = want[: want.index(2) + 1]
        assert ids == want, prompt


@pytest.fixture(scope="module")
def server(folder: str) -> Iterator[ServerProcess]:
    yield from serving([folder, "--speculative-config", MTP, "--tensor-parallel-size", "2"])


def test_serve_at_tp2_publishes_latent_caches_and_equals_generate(
    server: ServerProcess, folder: str, tokenizer: Any, generate: Generate
) -> None:
    log = server.output()
    for rank in range(2):
        assert f"rank {rank}: 3 KV caches published (2 target + 1 MTP, float32," in log, log
    c = openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    for prompt in PROMPTS:
        want = generate(prompt)
        got = c.completions.create(
            model=folder, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert (got.choices[0].text, got.choices[0].finish_reason) == (
            want["text"],
            want["finish_reason"],
        ), prompt
        assert got.usage.completion_tokens == len(want["token_ids"]), prompt


@pytest.fixture(scope="module")
def pd(folder: str) -> Iterator[list[ServerProcess]]:
    with splitwise_instances(
        ("prefill", MTP, "--model", folder),
        ("decode", MTP, "--model", folder, "--kv-transport", "shm"),
        ("decode", MTP, "--model", folder, "--kv-transport", "tcp"),
    ) as instances:
        yield instances


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_prefill_decode_equals_generate_and_hands_over_every_latent_cache(
    pd: list[ServerProcess], tokenizer: Any, generate: Generate, transport: str
) -> None:
    prefill, shm, tcp = pd
    decode = shm if transport == "shm" else tcp
    with splitwise_router(prefill, decode, tokenizer=tokenizer) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        for prompt in PROMPTS:
            want = generate(prompt)
            got = c.completions.create(
                model="fastdeploy-mtp-tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
            )
            assert (got.choices[0].text, got.choices[0].finish_reason) == (
                want["text"],
                want["finish_reason"],
            )
    prompt = PROMPTS[0]
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
