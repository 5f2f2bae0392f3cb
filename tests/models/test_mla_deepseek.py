"""DeepSeek-V3 folders (multi-head latent attention, MoE, an MTP layer without a position-0
embedding mask) against transformers: target logits, greedy tokens through our paged path,
MTP logits, K=1 acceptance round for round, the latent caches, TP slices and refusals.

The folders are tiny random ``DeepseekV3ForCausalLM`` checkpoints written by transformers
(tests/support/hf_mla_folders.py); the references are transformers' float32 outputs.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import paddle
import pytest
import transformers  # noqa: F401  (a test dependency: the comparison must run, never skip)

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.checks.reference import Reference
from fastdeploy_mtp.models import causal_bias, contiguous_block_tables, load_model
from fastdeploy_mtp.models.cache_spec import model_cache_specs
from fastdeploy_mtp.models.folder_inspection import inspect_model_folder
from fastdeploy_mtp.models.hf_config import UnsupportedModelError
from fastdeploy_mtp.models.latent_attention import LatentAttentionBackend
from fastdeploy_mtp.models.mtp_unrolled import unrolled_mtp_forward
from fastdeploy_mtp.runtime.request import Request
from tests.support import hf_mla_folders as ds
from tests.support.engines import make_config
from tests.support.folder_checks import (
    assert_target_matches_transformers,
    prefill_with_caches as prefill,
    relative_error,
)

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 33, 1, 77, 150, 9, 260, 31]
RTOL = 1e-4
#: (case id, make_mla_folder kwargs): q LoRA + yarn RoPE, and a plain q_proj with default RoPE.
CASES = {"qlora-yarn": dict(q_lora_rank=32, yarn=True), "plain-q": dict(q_lora_rank=0, yarn=False)}


@pytest.fixture(scope="module", params=sorted(CASES))
def folder(request, tmp_path_factory):
    return ds.make_mla_folder(tmp_path_factory.mktemp(request.param), **CASES[request.param])


@paddle.no_grad()
def test_config_is_mla_with_moe_and_unmasked_mtp(folder, loaded):
    _, mtp, config = loaded
    assert (config.model_type, config.attention_type) == ("deepseek_v3", "mla")
    assert config.q_lora_rank == (folder.config.get("q_lora_rank") or 0)
    assert (
        config.kv_lora_rank,
        config.qk_nope_head_dim,
        config.qk_rope_head_dim,
        config.v_head_dim,
    ) == (32, 16, 8, 16)
    assert config.rope_interleave and not config.mtp_mask_first_position
    assert config.mtp_final_norm == "in_logits"  # substep 2 is fed the block's pre-norm output
    assert config.n_routed_experts == 4 and config.first_k_dense_replace == 1
    assert mtp is not None and config.num_nextn_predict_layers == 1
    # the MTP layer's copies of the embedding and the head are in the folder, and not loaded
    assert {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"} <= set(
        folder.mtp_tensor_names
    )
    assert not any("embed_tokens" in n or "lm_head" in n for n, _ in mtp.named_parameters())


@paddle.no_grad()
def test_target_logits_and_greedy_tokens_match_transformers(folder, loaded):
    target, _, _ = loaded
    want = ds.mla_reference_logits(folder.path, [PROMPT])[0]
    target.attn_backend.absorbed = False  # keys and values rebuilt: the same logits within 1e-5
    try:
        rebuilt = target.compute_logits(prefill(target, PROMPT)[0]).numpy()
    finally:
        target.attn_backend.absorbed = True
    hidden, _ = prefill(target, PROMPT)
    np.testing.assert_allclose(rebuilt, target.compute_logits(hidden).numpy(), rtol=0, atol=1e-5)
    assert relative_error(rebuilt, want) <= RTOL
    # greedy_generate: one paged prefill, then one-token decode steps over the latent caches
    assert_target_matches_transformers(target, hidden, folder.path, PROMPT, RTOL)


@paddle.no_grad()
def test_mtp_logits_match_transformers_without_position_zero_mask(folder, loaded):
    _, mtp, _ = loaded
    hidden = ds.mla_reference_hidden(folder.path, [PROMPT])[0][:-1]
    next_ids = PROMPT[1:]
    want = ds.mla_reference_mtp_logits(folder.path, 0, [next_ids], hidden[None])[0]
    out, _ = prefill(mtp, next_ids, hidden)
    got = mtp.compute_logits(out).numpy()
    assert relative_error(got, want) <= RTOL
    assert (got.argmax(-1) == want.argmax(-1)).all()
    # the check can see the mask: with it, position 0's logits differ (and, through attention,
    # later ones)
    mtp.config.mtp_mask_first_position = True
    try:
        masked = mtp.compute_logits(prefill(mtp, next_ids, hidden)[0]).numpy()
    finally:
        mtp.config.mtp_mask_first_position = False
    assert np.abs(masked[0] - want[0]).max() > 1e-2


@paddle.no_grad()
def test_dense_paths_equal_the_paged_paths(folder, loaded):
    """The training path (full sequences, causal mask) and the unrolled one at depth 1 give the
    paged path's hidden states."""
    target, mtp, _ = loaded
    ids = paddle.to_tensor(np.asarray([PROMPT]))
    _, post = target.forward_dense(ids, causal_bias(len(PROMPT)))
    paged, _ = prefill(target, PROMPT)
    np.testing.assert_allclose(post.numpy()[0], paged.numpy(), rtol=1e-5, atol=1e-5)
    hidden = paged.numpy()[:-1]
    dense = mtp.forward_dense(
        ids[:, 1:], paddle.to_tensor(hidden[None]), causal_bias(len(PROMPT) - 1)
    )
    np.testing.assert_allclose(
        dense.numpy()[0], prefill(mtp, PROMPT[1:], hidden)[0].numpy(), rtol=1e-5, atol=1e-5
    )
    unrolled = unrolled_mtp_forward([mtp], ids[:, 1:], paddle.to_tensor(hidden[None]), 2)
    np.testing.assert_allclose(
        unrolled[0].numpy(), dense.numpy(), rtol=1e-5, atol=1e-5
    )  # depth 1 is the dense path


@paddle.no_grad()
def test_latent_caches_hold_normed_latent_and_roped_key_part(folder, loaded):
    target, mtp, config = loaded
    assert isinstance(target.attn_backend, LatentAttentionBackend)
    specs = model_cache_specs(config, 6)
    assert [(s.owner, s.layer, s.kind) for s in specs] == [
        ("target", 0, "latent"),
        ("target", 1, "latent"),
    ] + [("mtp", 0, "latent")]
    assert {s.shape for s in specs} == {(6, 1, config.block_size, 40)} and {
        s.dtype for s in specs
    } == {"float32"}
    _, caches = prefill(target, PROMPT)
    assert (
        len(caches) == 2
        and [list(c.shape) for c in caches] == [list(target.attn_backend.get_kv_cache_shape(2))] * 2
    )
    # layer 0's cached latent is exactly what its attention computes from its input
    attn = target.layers[0].self_attn
    x = target.layers[0].input_layernorm(target.embed_tokens(paddle.to_tensor(np.asarray(PROMPT))))
    cos, sin = target.rotary.lookup(np.arange(len(PROMPT)))
    latent = attn._latent(x, cos, sin).numpy()
    tables, _ = contiguous_block_tables([len(PROMPT)], config.block_size, shuffle_seed=1)
    rows = [
        caches[0].numpy()[tables[0, p // config.block_size], 0, p % config.block_size]
        for p in range(len(PROMPT))
    ]
    np.testing.assert_allclose(np.stack(rows), latent, rtol=1e-6, atol=1e-6)
    assert len(mtp.attn_backend.allocate_caches(mtp.num_cache_layers, 3)) == 1


@pytest.fixture(scope="module")
def small_vocab_folder(tmp_path_factory):
    """16 tokens: the random MTP layer's drafts are accepted often enough to test both kinds
    of round (token 15 never comes up in these prompts' greedy continuations: the EOS id)."""
    return ds.make_mla_folder(
        tmp_path_factory.mktemp("vocab16"), q_lora_rank=32, yarn=True, vocab_size=16
    )


@paddle.no_grad()
def test_k1_acceptance_round_for_round_equals_reference(small_vocab_folder):
    target, mtp, config = load_model(small_vocab_folder.path)
    prompts, max_tokens, eos = {"a": [1, 2, 3], "b": [5, 7, 1, 3, 9, 2, 11]}, 30, 15
    cfg = make_config(
        1, max_num_seqs=2, eos=(eos,), block_size=config.block_size, vocab=config.vocab_size,
        ori_vocab=config.ori_vocab_size, hidden=config.hidden_size,
    )  # fmt: skip
    engine = build_engine(cfg, target, mtp, record_trace=True)
    out = engine.generate(
        [Request(rid, list(p), max_tokens=max_tokens) for rid, p in prompts.items()]
    )
    accepted = rejected = 0
    decode_rounds = decode_tokens = 0
    reference = Reference(small_vocab_folder.path)
    for rid, prompt in prompts.items():
        # transformers' own generate(use_mtp=True), each round's draft recorded
        want = [
            (list(r.tokens), r.drafts[0] if r.drafts else None)
            for r in reference.generate_rounds(prompt, max_tokens)
        ]
        decode_rounds += len(want) - 1  # the first round is the prefill's token
        decode_tokens += sum(len(tokens) for tokens, _ in want[1:])
        steps = [t for t in engine.trace if t[1] == rid]
        assert eos not in out[rid]
        assert [list(t[3]) for t in steps] == [tokens for tokens, _ in want], rid
        # the trace's drafts: the one verified, -1 for none
        assert [list(t[4]) for t in steps] == [
            [-1 if draft is None else draft] for _, draft in want
        ], rid
        assert out[rid] == [tok for tokens, _ in want for tok in tokens]
        accepted += sum(len(tokens) == 2 for tokens, _ in want)
        rejected += sum(len(tokens) == 1 for tokens, _ in want[1:])
    assert accepted >= 5 and rejected >= 5
    # what `generate --json` reports as metrics.mean_accepted_length: the reference's rounds' mean
    assert engine.metrics.mean_accepted_length == pytest.approx(
        decode_tokens / decode_rounds, rel=1e-12
    )


def test_tensor_parallel_ranks_hold_their_head_slices(folder, loaded):
    full, _, config = loaded
    full_params = dict(full.named_parameters())
    for rank in range(2):
        target, mtp, _ = load_model(folder.path, tensor_parallel_size=2, tensor_parallel_rank=rank)
        assert mtp is not None
        assert target.attn_backend.num_heads == 2
        assert target.attn_backend.get_kv_cache_shape(5) == [5, 1, config.block_size, 40]
        assert model_cache_specs(config, 5, tensor_parallel_size=2)[0].shape == (
            5,
            1,
            config.block_size,
            40,
        )
        for name, p in target.named_parameters():
            whole = full_params[name].numpy()
            if name.endswith(("kv_b_proj.weight", "q_b_proj.weight", "q_proj.weight")):
                width = whole.shape[1] // 2
                np.testing.assert_array_equal(
                    p.numpy(), whole[:, rank * width : (rank + 1) * width]
                )
            elif name.endswith("self_attn.o_proj.weight"):
                height = whole.shape[0] // 2
                np.testing.assert_array_equal(p.numpy(), whole[rank * height : (rank + 1) * height])
            elif "self_attn" in name:  # q_a / kv_a projections and the latent norms: replicated
                np.testing.assert_array_equal(p.numpy(), whole)


BAD_KEYS = [
    ("kv_lora_rank", None, "no `kv_lora_rank`"),
    ("qk_rope_head_dim", 7, "`qk_rope_head_dim` must be even"),
    ("v_head_dim", 0, "`v_head_dim` must be >= 1, got 0"),
    ("q_lora_rank", "32", "`q_lora_rank` must be an integer"),
    ("rope_interleave", "yes", "`rope_interleave` must be true or false"),
    ("attention_bias", True, "`attention_bias` true is not supported"),
]


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory):
    return ds.make_mla_folder(tmp_path_factory.mktemp("nomtp"), num_mtp_layers=0)


@pytest.mark.parametrize("key,value,message", BAD_KEYS)
def test_bad_mla_keys_are_refused_with_one_line(plain_folder, tmp_path, key, value, message):
    shutil.copytree(plain_folder.path, tmp_path / "bad")
    path = tmp_path / "bad"
    raw = json.loads((path / "config.json").read_text())
    if value is None:
        raw.pop(key)
    else:
        raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModelError, match=message) as err:
        inspect_model_folder(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
