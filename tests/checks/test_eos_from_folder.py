"""End-of-sequence ids come from the model folder, through the engine ``generate`` runs: every id
of ``generation_config.json`` / ``config.json`` ends a request (finish reason ``stop``), a
folder whose last vocabulary id is an ordinary token generates past it, a folder without EOS
runs to ``max_tokens``, and ``ignore_eos`` masks the EOS ids."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastdeploy_mtp.capacity import NO_EOS, end_tokens
from fastdeploy_mtp.checks.reference import Reference
from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.entrypoints.offline import run_requests
from fastdeploy_mtp.models.folder_inspection import inspect_model_folder
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from fastdeploy_mtp.serving.engine_client.engine_loop import finish_reason_of
from tests.support import hf_folders
from tests.support.tokenizer_files import write_bpe_tokenizer

MTP = SpeculativeConfig(method="mtp", num_speculative_tokens=2, num_model_steps=2)
N = 40


def _set_eos(path, generation, config=None) -> None:
    gen = path / "generation_config.json"
    gen.write_text(json.dumps({"eos_token_id": generation}) + "\n")
    cfg = json.loads((path / "config.json").read_text())
    cfg["eos_token_id"] = config
    (path / "config.json").write_text(json.dumps(cfg) + "\n")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Llama folder of 300 ids whose tokenizer has all 300 (id 299 is an ordinary token), a
    tokenizer without an EOS token, and a prompt whose greedy continuation holds 299."""
    out = tmp_path_factory.mktemp("llama300")
    info = hf_folders.make_folder(
        out, "llama", tokenizer_writer=lambda o: write_bpe_tokenizer(str(o), 300)
    )
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["eos_token"] = None
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    _set_eos(out, None)
    ref = Reference(out)
    rng = np.random.default_rng(3)
    for _ in range(60):  # a prompt whose output holds the last id after a few tokens
        prompt = rng.integers(3, 300, size=int(rng.integers(3, 30))).tolist()
        greedy = ref.greedy(prompt, N)
        if 299 in greedy[2:-4]:
            return info.path, prompt, greedy
    pytest.fail("no prompt of 60 continues with id 299")


def _run(path, prompt, sampling=None):
    reqs, _, _ = run_requests([prompt], N, MTP, 1, "eos", str(path), sampling=sampling)
    return reqs[0]


def test_the_last_vocabulary_id_is_an_ordinary_token(folder):
    path, prompt, greedy = folder
    assert inspect_model_folder(path).eos_token_ids == []
    req = _run(path, prompt)
    assert (
        req.output_token_ids == greedy and finish_reason_of(req) == "length"
    )  # past 299, to max_tokens
    assert end_tokens([], 300, 300) == [NO_EOS] and end_tokens([], 300, 280) == [299]


def test_every_listed_eos_id_ends_a_request(folder, tmp_path):
    path, prompt, greedy = folder
    first, second = greedy[5], greedy[9]
    assert first not in greedy[:5] and second not in greedy[:9]
    _set_eos(path, [second, first])  # generation_config.json lists both
    try:
        req = _run(path, prompt)
        assert req.output_token_ids == greedy[:6] and finish_reason_of(req) == "stop"
        _set_eos(path, None, config=second)  # config.json alone
        req = _run(path, prompt)
        assert req.output_token_ids == greedy[:10] and finish_reason_of(req) == "stop"
        _set_eos(path, [first], config=second)  # both files count
        assert inspect_model_folder(path).eos_token_ids == [first, second]
        req = _run(path, prompt)
        assert req.output_token_ids == greedy[:6] and finish_reason_of(req) == "stop"
        ignored = _run(path, prompt, SamplingParams(ignore_eos=True))
        assert finish_reason_of(ignored) == "length" and len(ignored.output_token_ids) == N
        assert first not in ignored.output_token_ids and second not in ignored.output_token_ids
        assert ignored.output_token_ids[:5] == greedy[:5]
    finally:
        _set_eos(path, None)
