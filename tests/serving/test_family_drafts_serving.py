"""The dense MTP families through ``fastdeploy-mtp serve``: for each of Llama, Qwen2, Qwen3 and
MiMo (the draft-fidelity folders of ``tests/support/fidelity_cases.py``: padded and unpadded
vocabularies, q/k/v biases, q/k norm), a server with MTP (K = 1), chunked prefill on for half
of them, gives six token-id prompts sent at once transformers' own ``generate(use_mtp=True)``
tokens and drafts, round for round (``draft_logprobs``). The MoE and MLA families are checked
the same way by their own serving tests (GLM-4.5, DeepSeek-V3 at K = 2 and TP 2, ERNIE-4.5 at
TP 2)."""

from __future__ import annotations

import contextlib

import pytest

from tests.support.fidelity_cases import CASES
from tests.support.served_drafts import check_family_drafts_served
from tests.support.servers import serving

MTP = '{"method": "mtp", "num_speculative_tokens": 1}'
#: case -> prefill chunk size (0: whole prompts)
DENSE = {"llama-unpadded": 0, "qwen2-bias-padded": 8, "qwen3-qknorm": 0, "mimo": 8}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_serve_drafts_equal_transformers_round_for_round(name: str, tmp_path: object) -> None:
    folder = str(CASES[name](tmp_path))
    args = [
        folder,
        "--speculative-config",
        MTP,
        "--max-num-seqs",
        "6",
        "--prefill-chunk-size",
        str(DENSE[name]),
    ]
    with contextlib.contextmanager(serving)(args) as server:
        check_family_drafts_served(server.base_url, folder, k=1, label=f"{name} served")
