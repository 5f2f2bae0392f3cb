"""A GLM-4.5 folder (partial rotary, MoE layers, an MoE MTP layer) served end to end:
``generate --json`` with MTP drafting gives transformers' greedy tokens, and ``serve DIR`` at
tensor-parallel size 2 (every expert split over the ranks, one all-reduce per MoE block)
answers exactly as ``generate``."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fastdeploy_mtp.entrypoints.cli import main
from tests.support.hf_moe_folders import make_glm_folder, reference_greedy
from tests.support.served_drafts import check_family_drafts_served
from tests.support.servers import ServerProcess, serving
from tests.support.tokenizer_files import write_bpe_tokenizer

openai = pytest.importorskip("openai")

MTP = '{"method": "mtp", "num_speculative_tokens": 2}'
MAX_TOKENS = 16
PROMPTS = ["Speculative decoding drafts", "The quick brown fox"]
Generate = Callable[[str], dict[str, Any]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("glm4-moe")
    make_glm_folder(out, qk_norm=True, seed=2, echo=True, tokenizer_writer=write_bpe_tokenizer)
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
        want = reference_greedy(folder, tokenizer.encode(prompt), MAX_TOKENS)
        if 2 in want:  # the folder's EOS id ends the request (and is its last token)
            want = want[: want.index(2) + 1]
        assert ids == want, prompt


@pytest.fixture(scope="module")
def server(folder: str) -> Iterator[ServerProcess]:
    yield from serving([folder, "--speculative-config", MTP, "--tensor-parallel-size", "2"])


def test_serve_at_tp2_equals_generate(
    server: ServerProcess, folder: str, generate: Generate
) -> None:
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


def test_serve_at_tp2_drafts_equal_the_chained_reference_round_for_round(
    server: ServerProcess, folder: str
) -> None:
    """K = 2 through the TP 2 server: every round's tokens and drafts equal transformers' MTP
    layer chained by the rule the engine states for GLM-4.5 (substep 2 fed the block's output
    before the final norm)."""
    check_family_drafts_served(server.base_url, folder, k=2, label="glm45 TP2")
