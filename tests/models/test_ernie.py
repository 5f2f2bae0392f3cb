"""ERNIE-4.5 folders (``Ernie4_5ForCausalLM``, ``Ernie4_5_MoeForCausalLM``: interleaved RoPE,
softmax router with a correction bias, an MTP layer sharing the final norm) against
transformers: config translation and refusals, target logits, greedy tokens through our paged
path, MTP logits, the router's choice, K=1 acceptance round for round and TP expert slices.

The folders are tiny random checkpoints written by transformers
(tests/support/hf_ernie_folders.py); the references are transformers' float32 outputs.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import paddle
import pytest
import transformers  # noqa: F401  (a test dependency: the comparison must run, never skip)

from fastdeploy_mtp.models import load_model
from fastdeploy_mtp.models.folder_inspection import inspect_model_folder
from fastdeploy_mtp.models.hf_config import UnsupportedModelError, translate_config
from fastdeploy_mtp.models.layers import apply_rope
from fastdeploy_mtp.models.moe import MoEMLP
from tests.support import folder_checks, hf_ernie_folders as ernie
from tests.support.engines import check_k1_rounds_against_transformers
from tests.support.folder_checks import prefill, relative_error

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 33, 1, 77, 150, 9, 260, 31]
RTOL = 1e-4

#: (case id, make_ernie_folder kwargs): the MoE family tied with echoed values (K=1 drafts
#: accepted in some rounds; its MTP block is dense, moe_layer_start_index 1), the MoE family
#: untied with MoE layers from 0 (so the MTP block is an MoE block too), and the dense family.
CASES = {
    "moe-tied-echo": dict(moe=True, echo=True),
    "moe-start0-untied": dict(moe=True, tie=False, moe_layer_start_index=0, seed=1),
    "dense-tied": dict(moe=False, seed=2),
}


#: The cases with a router, and the one whose MTP block has experts too.
MOE_CASES = sorted(c for c in CASES if CASES[c]["moe"])
MOE_MTP_CASE = "moe-start0-untied"
_BUILT: dict[str, tuple] = {}


def _built(case: str, tmp_path_factory) -> tuple:
    """(folder, load_model of it) of ``case``, built once per module run."""
    if case not in _BUILT:
        info = ernie.make_ernie_folder(tmp_path_factory.mktemp(case), **CASES[case])
        _BUILT[case] = (info, load_model(info.path))
    return _BUILT[case]


@pytest.fixture(scope="module", params=sorted(CASES))
def folder(request, tmp_path_factory):
    return _built(request.param, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def loaded(folder):
    return next(built for info, built in _BUILT.values() if info is folder)


@pytest.fixture(scope="module", params=MOE_CASES)
def moe_case(request, tmp_path_factory):
    return _built(request.param, tmp_path_factory)


def test_config_translates_ernie_keys(folder, loaded):
    target, mtp, config = loaded
    raw = folder.config
    assert config.model_type == ("ernie4_5_moe" if folder.moe else "ernie4_5")
    assert (config.rope_interleave, config.rope_theta, config.head_dim) == (True, 500000.0, 32)
    assert (config.tie_word_embeddings, config.rms_norm_eps, config.attention_bias) == (
        folder.tie,
        1e-5,
        False,
    )
    assert (config.num_nextn_predict_layers, config.eos_token_ids) == (1, list(ernie.EOS_TOKEN_IDS))
    assert (config.mtp_final_norm, config.mtp_hidden_state, config.mtp_concat_order) == (
        "in_forward", "post_norm", "emb_first"
    )  # fmt: skip
    assert not config.mtp_mask_first_position
    if not folder.moe:
        assert config.n_routed_experts == 0 and not any(
            isinstance(b.mlp, MoEMLP) for b in target.layers
        )
        assert not isinstance(mtp.mtp_block.mlp, MoEMLP)
        return
    assert (config.n_routed_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (
        8,
        2,
        32,
    )
    assert (config.n_shared_experts, config.moe_norm_min, config.moe_statics) == (1, 1e-12, True)
    start = raw["moe_layer_start_index"]
    assert (
        config.moe_layer_start_index,
        config.moe_layer_end_index,
        config.moe_layer_interval,
    ) == (start, 2, 1)
    routing = (
        config.scoring_func,
        config.topk_method,
        config.n_group,
        config.routed_scaling_factor,
    )
    assert routing == ("softmax", "noaux_tc", 1, 1.0)
    assert [isinstance(b.mlp, MoEMLP) for b in target.layers] == [i >= start for i in range(3)]
    # MTP layer 0 is built as decoder layer 0 of transformers' MTP config
    assert isinstance(mtp.mtp_block.mlp, MoEMLP) == (start == 0)


@paddle.no_grad()
def test_target_logits_and_greedy_tokens_match_transformers(folder, loaded):
    target, _, _ = loaded
    hidden = prefill(target, PROMPT)
    folder_checks.assert_target_matches_transformers(
        target, hidden, folder.path, PROMPT, RTOL, greedy=ernie.reference_greedy
    )


@paddle.no_grad()
def test_mtp_logits_match_transformers(folder, loaded):
    _, mtp, _ = loaded
    hidden = ernie.reference_hidden(folder.path, [PROMPT])[0][:-1]
    next_ids = PROMPT[1:]
    want_logits, want_out = ernie.reference_mtp_step(folder.path, [next_ids], hidden[None])
    out = prefill(mtp, next_ids, hidden)
    assert relative_error(out.numpy(), want_out[0]) <= RTOL  # normed: what substep 2 is fed
    got = mtp.compute_logits(out).numpy()
    assert relative_error(got, want_logits[0]) <= RTOL
    top2 = np.sort(want_logits[0], -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 10 * RTOL * np.abs(want_logits).max()
    assert clear.mean() > 0.8 and (got.argmax(-1) == want_logits[0].argmax(-1))[clear].all()


@paddle.no_grad()
def test_router_with_correction_bias_picks_what_transformers_picks(moe_case):
    folder, (target, _, _) = moe_case
    layer = folder.config["moe_layer_start_index"]
    x = np.random.default_rng(7).standard_normal((96, 64)).astype(np.float32)
    want_w, want_idx = ernie.reference_router(folder.path, layer, x)
    gate = target.layers[layer].mlp.gate
    got_w, got_idx = (t.numpy() for t in gate(paddle.to_tensor(x)))
    np.testing.assert_array_equal(np.sort(got_idx, -1), np.sort(want_idx, -1))
    order, want_order = np.argsort(got_idx, -1), np.argsort(want_idx, -1)
    np.testing.assert_allclose(
        np.take_along_axis(got_w, order, -1), np.take_along_axis(want_w, want_order, -1), rtol=1e-5
    )
    bias = gate.e_score_correction_bias
    assert list(bias.shape) == [1, 8]
    saved = bias.numpy()
    bias.set_value(paddle.zeros_like(bias))
    try:
        unbiased = gate(paddle.to_tensor(x))[1].numpy()
    finally:
        bias.set_value(paddle.to_tensor(saved))
    assert (np.sort(unbiased, -1) != np.sort(want_idx, -1)).any(
        axis=-1
    ).mean() > 0.1  # the bias steers


@paddle.no_grad()
def test_k1_acceptance_round_for_round_equals_reference(folder, loaded):
    check_k1_rounds_against_transformers(loaded, folder.path, PROMPT[:7], 16, folder.echo)


def test_tensor_parallel_ranks_hold_their_expert_slices(tmp_path_factory):
    """The case whose MTP block has experts: every expert slice of target and MTP layer."""
    folder, (full, full_mtp, _) = _built(MOE_MTP_CASE, tmp_path_factory)
    assert folder.config["moe_layer_start_index"] == 0
    folder_checks.assert_two_ranks_hold_their_expert_slices(folder.path, full, full_mtp)


# ---- translation without a folder ----------------------------------------------------------


def _raw(moe: bool, **overrides):
    raw = {
        "architectures": [ernie.ARCHITECTURES[moe]], "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "vocab_size": 300,
    }  # fmt: skip
    raw.update(overrides)
    return {k: v for k, v in raw.items() if v is not None}


def test_absent_keys_take_transformers_defaults():
    dense = translate_config(_raw(False), "d")
    assert (dense.head_dim, dense.rope_theta, dense.tie_word_embeddings) == (128, 500000.0, True)
    assert (dense.num_nextn_predict_layers, dense.rope_interleave) == (0, True)
    moe = translate_config(
        _raw(True, num_mtp_layers=1, rope_theta=10000.0, tie_word_embeddings=False), "m"
    )
    assert (
        moe.head_dim,
        moe.rope_theta,
        moe.tie_word_embeddings,
        moe.num_nextn_predict_layers,
    ) == (16, 1e4, False, 1)
    experts = (moe.n_routed_experts, moe.num_experts_per_tok, moe.moe_intermediate_size)
    assert (*experts, moe.n_shared_experts) == (64, 6, 1536, 2)
    assert (moe.moe_layer_start_index, moe.moe_layer_end_index, moe.moe_layer_interval) == (1, 3, 1)
    interval = translate_config(
        _raw(True, moe_layer_interval=2, moe_layer_end_index=2, moe_layer_start_index=0), "i"
    )
    assert [interval.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    assert [interval.is_moe_layer(4 + k) for k in range(2)] == [False, True]  # MTP layer k: index k


#: (family is MoE, config.json key, bad value, what the one-line refusal says)
BAD_KEYS = [
    (False, "use_bias", True, "`use_bias` true is not supported"),
    (True, "use_bias", "no", "`use_bias` must be true or false"),
    (False, "tie_word_embeddings", 1, "`tie_word_embeddings` must be true or false"),
    (True, "num_nextn_predict_layers", 2, "`num_nextn_predict_layers` 2 is not supported"),
    (True, "moe_num_experts", "8", "`moe_num_experts` must be an integer"),
    (True, "moe_num_experts", 1, "`moe_num_experts` must be >= 2"),
    (True, "moe_k", 70, "`moe_k` (70) must be <= `moe_num_experts` (64)"),
    (True, "moe_intermediate_size", 0, "`moe_intermediate_size` must be >= 1"),
    (True, "moe_num_shared_experts", -1, "`moe_num_shared_experts` must be >= 0"),
    (
        True,
        "moe_layer_start_index",
        5,
        "`moe_layer_start_index` (5) must be <= `moe_layer_end_index` (3)",
    ),
    (True, "moe_layer_end_index", -2, "`moe_layer_end_index` must be >= -1"),
    (True, "moe_layer_interval", 0, "`moe_layer_interval` must be >= 1"),
    (True, "moe_norm_min", 0, "`moe_norm_min` must be a number > 0"),
]


@pytest.mark.parametrize(
    "moe, key, value, message", BAD_KEYS, ids=[f"{k}={v!r}" for _, k, v, _ in BAD_KEYS]
)
def test_bad_ernie_keys_are_refused_naming_the_key(moe, key, value, message):
    with pytest.raises(UnsupportedModelError) as info:
        translate_config(_raw(moe, **{key: value}), "/models/ernie")
    text = str(info.value)
    assert message in text and "/models/ernie" in text and "\n" not in text


def test_a_folder_with_use_bias_is_refused(tmp_path, folder):
    bad = tmp_path / "bad"
    shutil.copytree(folder.path, bad)
    config = json.loads((bad / "config.json").read_text())
    config["use_bias"] = True
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UnsupportedModelError, match=r"model folder .*bad: config.json `use_bias` true"
    ):
        inspect_model_folder(bad)


@paddle.no_grad()
def test_interleaved_rope_rotates_pairs_then_deinterleaves():
    """``apply_rope(interleave=True)`` = the GPT-J rotation of pairs ``(x[2i], x[2i+1])`` at
    frequency ``i``, returned with the even outputs first and the odd ones after."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 2, 8)).astype(np.float32)
    angle = rng.standard_normal((5, 4)).astype(np.float32)
    cos = paddle.to_tensor(np.cos(np.concatenate([angle, angle], -1)))
    sin = paddle.to_tensor(np.sin(np.concatenate([angle, angle], -1)))
    got = apply_rope(paddle.to_tensor(x), cos, sin, interleave=True).numpy()
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    even, odd = x[..., 0::2] * c - x[..., 1::2] * s, x[..., 1::2] * c + x[..., 0::2] * s
    np.testing.assert_allclose(got, np.concatenate([even, odd], -1), rtol=1e-6, atol=1e-6)
