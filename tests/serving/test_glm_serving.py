"""A GLM-4.5 folder (partial rotary, MoE layers, an MoE MTP layer) served end to end:
``generate --json`` with MTP drafting gives transformers' greedy tokens, and ``serve DIR`` at
tensor-parallel size 2 (every expert split over the ranks, one all-reduce per MoE block)
answers exactly as ``generate``."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.support import folder_serving as fs
from tests.support.hf_moe_folders import make_glm_folder, reference_greedy
from tests.support.served_drafts import check_family_drafts_served
from tests.support.servers import ServerProcess
from tests.support.tokenizer_files import write_bpe_tokenizer

pytest.importorskip("openai")

folder, tokenizer = fs.folder_fixtures(
    "glm4-moe",
    lambda out: make_glm_folder(
        out, qk_norm=True, seed=2, echo=True, tokenizer_writer=write_bpe_tokenizer
    ),
)


#: ``generate(prompt)``: ``fastdeploy-mtp generate --json`` greedy with MTP, parsed
generate = fs.generate_fixture(fs.K2_MTP, fs.K2_MAX_TOKENS, "--temperature", "0")


def test_generate_gives_transformers_greedy_tokens(
    folder: str, tokenizer: Any, generate: fs.Generate
) -> None:
    greedy = functools.partial(reference_greedy, folder, n=fs.K2_MAX_TOKENS)
    fs.check_generate_equals_reference(generate, tokenizer, fs.K2_PROMPTS, greedy, eos=2)


server = fs.tp2_server_fixture(fs.K2_MTP)


def test_serve_at_tp2_equals_generate(
    server: ServerProcess, folder: str, generate: fs.Generate
) -> None:
    fs.check_greedy_equals_generate(
        server.base_url, folder, fs.K2_PROMPTS, fs.K2_MAX_TOKENS, generate
    )


def test_serve_at_tp2_drafts_equal_the_chained_reference_round_for_round(
    server: ServerProcess, folder: str
) -> None:
    """K = 2 through the TP 2 server: every round's tokens and drafts equal transformers' MTP
    layer chained by the rule the engine states for GLM-4.5 (substep 2 fed the block's output
    before the final norm)."""
    check_family_drafts_served(server.base_url, folder, k=2, label="glm45 TP2")
