"""Model folders of every supported family against transformers: target logits and hidden
states, greedy tokens through our paged path, and each MTP layer's logits for the same inputs.

The folders are tiny random checkpoints written by transformers itself
(tests/support/hf_folders.py); the references are transformers' float32 outputs.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

# transformers (and torch) are test dependencies (`.[test]`): the comparison must run, never skip
import transformers  # noqa: E402, F401

from fastdeploy_mtp.models import greedy_generate, load_model  # noqa: E402
from fastdeploy_mtp.models.mtp_layer import MTPStack  # noqa: E402
from tests.support import hf_folders  # noqa: E402
from tests.support.folder_checks import prefill, relative_error

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 33, 1, 77, 150, 9, 260, 31]
RTOL = 1e-4

#: (case id, make_folder kwargs): every family, tied and untied, each RoPE type, 0/1/2 MTP layers,
#: single-file and sharded folders, transformers-4 and -5 config keys.
CASES = {
    "llama-mtp1": dict(family="llama", num_mtp_layers=1, sharded=False),
    "llama-tied-llama3-nomtp": dict(
        family="llama", num_mtp_layers=0, tie=True, rope_scaling=hf_folders.rope_example("llama3")
    ),
    "qwen2-bias-yarn-mtp2-legacy": dict(
        family="qwen2",
        num_mtp_layers=2,
        rope_scaling=hf_folders.rope_example("yarn"),
        legacy_config=True,
    ),
    "qwen3-qknorm-linear-mtp1": dict(
        family="qwen3", num_mtp_layers=1, rope_scaling=hf_folders.rope_example("linear")
    ),
    "qwen3-tied-dynamic-mtp2": dict(
        family="qwen3", num_mtp_layers=2, tie=True, rope_scaling=hf_folders.rope_example("dynamic")
    ),
    "mimo-mtp2": dict(family="mimo", num_mtp_layers=2),
    "mimo-mtp1-legacy": dict(family="mimo", num_mtp_layers=1, legacy_config=True),
    "qwen2-bf16-stored-mtp1": dict(family="qwen2", num_mtp_layers=1, dtype="bfloat16"),
}
#: load_model's dtype per case: a BF16 folder is widened to float32 (exact), which is also what
#: the transformers reference computes in.
LOAD_DTYPE = {"qwen2-bf16-stored-mtp1": "float32"}


@pytest.fixture(scope="module", params=sorted(CASES))
def folder(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    info = hf_folders.make_folder(out, **CASES[request.param])
    return info, LOAD_DTYPE.get(request.param, "auto")


def mtp_logits(mtp, hidden: paddle.Tensor, layer: int) -> np.ndarray:
    extra = {"layer": layer} if isinstance(mtp, MTPStack) else {}
    return mtp.compute_logits(hidden, **extra).numpy()


@paddle.no_grad()
def test_target_matches_transformers(folder):
    folder, dtype = folder
    target, mtp, config = load_model(folder.path, dtype=dtype)
    assert config.dtype == "float32"
    assert config.model_type == folder.family
    assert (mtp is None) == (folder.num_mtp_layers == 0)
    assert config.eos_token_ids == list(folder.eos_token_ids)
    hidden = prefill(target, PROMPT)
    want_logits = hf_folders.reference_logits(folder.path, [PROMPT])[0]
    want_hidden = hf_folders.reference_hidden(folder.path, [PROMPT])[0]
    assert relative_error(target.compute_logits(hidden).numpy(), want_logits) <= RTOL
    assert relative_error(hidden.numpy(), want_hidden) <= RTOL
    assert greedy_generate(target, PROMPT[:6], 12) == hf_folders.reference_greedy(
        folder.path, PROMPT[:6], 12
    )


@paddle.no_grad()
def test_mtp_layers_match_transformers(folder):
    folder, dtype = folder
    if folder.num_mtp_layers == 0:
        _, mtp, _ = load_model(folder.path, dtype=dtype)
        assert mtp is None
        return
    _, mtp, config = load_model(folder.path, dtype=dtype)
    assert config.num_nextn_predict_layers == folder.num_mtp_layers
    hidden = hf_folders.reference_hidden(folder.path, [PROMPT])[0][:-1]
    next_ids = PROMPT[1:]
    for layer in range(folder.num_mtp_layers):
        want_logits, want_out = hf_folders.reference_mtp_step(
            folder.path, layer, [next_ids], hidden[None]
        )
        out = prefill(mtp, next_ids, hidden, layer)
        assert relative_error(out.numpy(), want_out[0]) <= RTOL
        got = mtp_logits(mtp, out, layer)
        assert relative_error(got, want_logits[0]) <= RTOL
        assert (got.argmax(-1) == want_logits[0].argmax(-1)).all()
        hidden, next_ids = want_out[0][:-1], next_ids[1:]
