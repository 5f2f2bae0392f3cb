"""Loading MTP layers from synthetic checkpoints written with each family's real tensor
names and layouts, checked against a direct numpy computation."""

import numpy as np
import paddle
import pytest
from safetensors.numpy import save_file

from fastdeploy_mtp.models import (
    FAMILIES,
    MissingTensorError,
    TensorShapeError,
    UnsupportedTensorError,
    config_for_family,
    contiguous_block_tables,
    load_mtp_weights,
    load_state_strict,
    make_forward_meta,
)
from tests.support.models import build_models, small_config

import mtp_numpy_reference as ref

# float32 Paddle vs float64 numpy
ATOL, RTOL = 1e-4, 1e-4
DEEPSEEK_INDEX, GLM_INDEX = 3, 5


def our_weights(cfg, seed):
    """Random MTP weights under our parameter names, Paddle [in, out] layout, plus the
    shared embedding [V, H] and head [H, V]."""
    rng = np.random.default_rng(seed)
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def lin(a, b):
        return (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)

    def norm():
        return (1 + 0.3 * rng.standard_normal(h)).astype(np.float32)

    w = {
        "enorm.weight": norm(),
        "hnorm.weight": norm(),
        "norm.weight": norm(),
        "eh_proj.weight": lin(2 * h, h),
        "mtp_block.input_layernorm.weight": norm(),
        "mtp_block.post_attention_layernorm.weight": norm(),
        "mtp_block.self_attn.q_proj.weight": lin(h, q),
        "mtp_block.self_attn.k_proj.weight": lin(h, kv),
        "mtp_block.self_attn.v_proj.weight": lin(h, kv),
        "mtp_block.self_attn.o_proj.weight": lin(q, h),
        "mtp_block.mlp.gate_proj.weight": lin(h, i),
        "mtp_block.mlp.up_proj.weight": lin(h, i),
        "mtp_block.mlp.down_proj.weight": lin(i, h),
    }
    if cfg.attention_bias:
        for p, n in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            w[f"mtp_block.self_attn.{p}.bias"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
    emb = rng.standard_normal((v, h)).astype(np.float32)
    head = lin(h, v)
    return w, emb, head


def block_tensors(w, prefix, torch_layout, norm_shift=0.0):
    """Dense decoder block under HF/Qwen2/DeepSeek-dense names."""
    t = (lambda a: np.ascontiguousarray(a.T)) if torch_layout else (lambda a: a)
    out = {
        prefix + "input_layernorm.weight": w["mtp_block.input_layernorm.weight"] - norm_shift,
        prefix + "post_attention_layernorm.weight": w["mtp_block.post_attention_layernorm.weight"]
        - norm_shift,
    }
    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
        out[f"{prefix}self_attn.{p}.weight"] = t(w[f"mtp_block.self_attn.{p}.weight"])
        if f"mtp_block.self_attn.{p}.bias" in w:
            out[f"{prefix}self_attn.{p}.bias"] = w[f"mtp_block.self_attn.{p}.bias"]
    for p in ("gate_proj", "up_proj", "down_proj"):
        out[f"{prefix}mlp.{p}.weight"] = t(w[f"mtp_block.mlp.{p}.weight"])
    return out


def write_ernie(w, emb, head):
    b = "ernie.mtp_block.0."
    ckpt = {
        "ernie.mtp_emb_norm.0.weight": w["enorm.weight"],
        "ernie.mtp_hidden_norm.0.weight": w["hnorm.weight"],
        "ernie.mtp_linear_proj.0.weight": w["eh_proj.weight"],  # Paddle [2H, H]
        "ernie.norm.weight": w["norm.weight"],  # main model's norm
        b + "input_layernorm.weight": w["mtp_block.input_layernorm.weight"],
        b + "post_attention_layernorm.weight": w["mtp_block.post_attention_layernorm.weight"],
        b + "self_attn.qkv_proj.weight": np.concatenate(
            [w[f"mtp_block.self_attn.{p}_proj.weight"] for p in "qkv"], axis=1
        ),
        b + "self_attn.o_proj.weight": w["mtp_block.self_attn.o_proj.weight"],
        b + "mlp.up_gate_proj.weight": np.concatenate(
            [w["mtp_block.mlp.gate_proj.weight"], w["mtp_block.mlp.up_proj.weight"]], axis=1
        ),
        b + "mlp.down_proj.weight": w["mtp_block.mlp.down_proj.weight"],
        "ernie.embed_tokens.weight": emb,
        "lm_head.weight": head,
        "ernie.layers.0.self_attn.o_proj.weight": np.zeros((3, 3), np.float32),
    }
    return ckpt


def write_ernie_pt(w, emb, head):
    """ERNIE-4.5 as the HuggingFace "-PT" folders name it: torch layout, separate q/k/v and
    gate/up, the final norm shared with the main model."""
    ckpt = {
        "model.mtp_emb_norm.0.weight": w["enorm.weight"],
        "model.mtp_hidden_norm.0.weight": w["hnorm.weight"],
        "model.mtp_linear_proj.0.weight": np.ascontiguousarray(w["eh_proj.weight"].T),  # [H, 2H]
        "model.norm.weight": w["norm.weight"],  # main model's norm
        "model.embed_tokens.weight": emb,
        "lm_head.weight": np.ascontiguousarray(head.T),
        "model.layers.0.input_layernorm.weight": np.ones(7, np.float32),
    }
    ckpt.update(block_tensors(w, "model.mtp_block.0.", torch_layout=True))
    return ckpt


def write_deepseek_style(w, emb, head, index):
    p = f"model.layers.{index}."
    ckpt = {
        p + "enorm.weight": w["enorm.weight"],
        p + "hnorm.weight": w["hnorm.weight"],
        p + "eh_proj.weight": np.ascontiguousarray(w["eh_proj.weight"].T),  # [H, 2H]
        p + "shared_head.norm.weight": w["norm.weight"],
        p + "embed_tokens.weight": emb,
        p + "shared_head.head.weight": np.ascontiguousarray(head.T),  # [V, H]
        "model.layers.0.input_layernorm.weight": np.ones(7, np.float32),
    }
    ckpt.update(block_tensors(w, p, torch_layout=True))
    return ckpt


def write_qwen3_next(w, emb, head):
    # Qwen3-Next RMSNorm computes x_normed * (1 + weight): stored weights are ours - 1.
    ckpt = {
        "mtp.pre_fc_norm_embedding.weight": w["enorm.weight"] - 1,
        "mtp.pre_fc_norm_hidden.weight": w["hnorm.weight"] - 1,
        "mtp.fc.weight": np.ascontiguousarray(w["eh_proj.weight"].T),
        "mtp.norm.weight": w["norm.weight"] - 1,
        "model.embed_tokens.weight": emb,
        "lm_head.weight": np.ascontiguousarray(head.T),
    }
    ckpt.update(block_tensors(w, "mtp.layers.0.", torch_layout=True, norm_shift=1.0))
    return ckpt


def write_mimo(w, emb, head):
    p = "model.mtp_layers.0."
    ckpt = {
        p + "token_layernorm.weight": w["enorm.weight"],
        p + "hidden_layernorm.weight": w["hnorm.weight"],
        # input_proj consumes cat[hidden, emb]; our eh_proj (hidden_first config) too
        p + "input_proj.weight": np.ascontiguousarray(w["eh_proj.weight"].T),
        p + "final_layernorm.weight": w["norm.weight"],
        "model.embed_tokens.weight": emb,
        "lm_head.weight": np.ascontiguousarray(head.T),
    }
    ckpt.update(block_tensors(w, p, torch_layout=True))
    return ckpt


WRITERS = {
    "ernie4_5": (write_ernie, {}),
    "ernie4_5_pt": (write_ernie_pt, {}),
    "deepseek_v3": (lambda w, e, h: write_deepseek_style(w, e, h, DEEPSEEK_INDEX), {}),
    "glm4_5": (lambda w, e, h: write_deepseek_style(w, e, h, GLM_INDEX), {"attention_bias": True}),
    "qwen3_next": (write_qwen3_next, {}),
    "mimo": (write_mimo, {"attention_bias": True}),
}


def family_models(family, seed=0, **overrides):
    cfg = config_for_family(family, small_config(**{**WRITERS[family][1], **overrides}))
    target, mtp = build_models(cfg, seed=seed + 100)  # random weights, overwritten by loading
    return cfg, target, mtp


def run_mtp(mtp, cfg, next_ids, hidden):
    tables, n = contiguous_block_tables([len(next_ids)], cfg.block_size)
    caches = mtp.attn_backend.allocate_caches(1, n)
    meta = make_forward_meta(
        [len(next_ids)], [0], tables, caches, cfg.block_size, ids_remove_padding=next_ids
    )
    out = mtp(meta.ids_remove_padding, paddle.to_tensor(hidden.astype(np.float32)), meta)
    return out, mtp.compute_logits(out).numpy()


def test_every_family_has_a_writer():
    assert sorted(FAMILIES) == sorted(WRITERS)


@pytest.mark.parametrize("family", sorted(WRITERS))
def test_loaded_family_layer_matches_numpy(family, tmp_path):
    cfg, target, mtp = family_models(family)
    w, emb, head = our_weights(cfg, seed=11)
    path = tmp_path / f"{family}.safetensors"
    save_file(WRITERS[family][0](w, emb, head), str(path))
    loaded = load_mtp_weights(mtp, str(path), family, load_shared=True)
    assert set(loaded) >= {n for n, _ in mtp.named_parameters()}

    rng = np.random.default_rng(12)
    next_ids = rng.integers(0, cfg.ori_vocab_size, 9)
    hidden = rng.standard_normal((9, cfg.hidden_size))
    out, logits = run_mtp(mtp, cfg, next_ids, hidden)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    expect = ref.mtp_hidden(next_ids, hidden, w64, emb.astype(np.float64), cfg)
    np.testing.assert_allclose(out.numpy(), expect, rtol=RTOL, atol=ATOL, err_msg=family)
    expect_logits = ref.mtp_logits(expect, w64, head.astype(np.float64), cfg)
    v = cfg.ori_vocab_size
    np.testing.assert_allclose(
        logits[:, :v], expect_logits[:, :v], rtol=RTOL, atol=ATOL, err_msg=family
    )
    assert np.all(np.isneginf(logits[:, v:]))


def test_mimo_concat_order_is_hidden_first_and_enforced(tmp_path):
    cfg, _, mtp = family_models("mimo")
    assert cfg.mtp_concat_order == "hidden_first"
    w, emb, head = our_weights(cfg, seed=13)
    wrong = config_for_family("deepseek_v3", small_config(attention_bias=True))
    _, mtp_wrong = build_models(wrong, seed=1)
    with pytest.raises(ValueError, match="mtp_concat_order"):
        load_mtp_weights(mtp_wrong, write_mimo(w, emb, head), "mimo")


def test_sharded_directory_and_explicit_layer_index(tmp_path):
    cfg, _, mtp = family_models("deepseek_v3")
    w, emb, head = our_weights(cfg, seed=14)
    ckpt = write_deepseek_style(w, emb, head, DEEPSEEK_INDEX)
    names = sorted(ckpt)
    save_file({k: ckpt[k] for k in names[::2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: ckpt[k] for k in names[1::2]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    loaded = load_mtp_weights(mtp, str(tmp_path), "deepseek_v3", layer_index=DEEPSEEK_INDEX)
    assert loaded["eh_proj.weight"] == f"model.layers.{DEEPSEEK_INDEX}.eh_proj.weight"
    np.testing.assert_array_equal(mtp.eh_proj.weight.numpy(), w["eh_proj.weight"])
    with pytest.raises(MissingTensorError, match="model.layers.61.enorm.weight"):
        load_mtp_weights(mtp, str(tmp_path), "deepseek_v3", layer_index=61)


def _deepseek_ckpt(seed=15):
    cfg, _, mtp = family_models("deepseek_v3")
    w, emb, head = our_weights(cfg, seed=seed)
    return mtp, write_deepseek_style(w, emb, head, DEEPSEEK_INDEX)


def test_missing_tensor_is_named():
    mtp, ckpt = _deepseek_ckpt()
    del ckpt["model.layers.3.self_attn.v_proj.weight"]
    with pytest.raises(MissingTensorError, match=r"model\.layers\.3\.self_attn\.v_proj\.weight"):
        load_mtp_weights(mtp, ckpt, "deepseek_v3")


def test_misshapen_tensor_names_expected_and_got_shape():
    mtp, ckpt = _deepseek_ckpt()
    ckpt["model.layers.3.eh_proj.weight"] = np.zeros((32, 65), np.float32)
    with pytest.raises(TensorShapeError) as info:
        load_mtp_weights(mtp, ckpt, "deepseek_v3")
    msg = str(info.value)
    assert "model.layers.3.eh_proj.weight" in msg and "[32, 65]" in msg and "[32, 64]" in msg


def test_untransposed_torch_weight_is_a_shape_error():
    mtp, ckpt = _deepseek_ckpt()
    name = "model.layers.3.mlp.down_proj.weight"
    ckpt[name] = np.ascontiguousarray(ckpt[name].T)  # Paddle layout in a torch-layout family
    with pytest.raises(TensorShapeError, match=r"mlp\.down_proj\.weight"):
        load_mtp_weights(mtp, ckpt, "deepseek_v3")


@pytest.mark.parametrize(
    "extra,hint",
    [
        ("model.layers.3.mlp.experts.0.gate_proj.weight", "MoE"),
        ("model.layers.3.mlp.gate.weight", "MoE"),
        ("model.layers.3.self_attn.q_a_proj.weight", "MLA"),
        ("model.layers.3.self_attn.q_norm.weight", "q/k norms"),
    ],
)
def test_moe_and_mla_tensors_are_rejected_by_name(extra, hint):
    mtp, ckpt = _deepseek_ckpt()
    ckpt[extra] = np.zeros((4, 4), np.float32)
    with pytest.raises(UnsupportedTensorError, match=hint) as info:
        load_mtp_weights(mtp, ckpt, "deepseek_v3")
    assert extra in str(info.value)


def test_two_mtp_layers_are_rejected():
    mtp, ckpt = _deepseek_ckpt()
    ckpt["model.layers.4.enorm.weight"] = ckpt["model.layers.3.enorm.weight"]
    with pytest.raises(UnsupportedTensorError, match="exactly one MTP layer"):
        load_mtp_weights(mtp, ckpt, "deepseek_v3")


def test_unknown_family_lists_supported():
    mtp, ckpt = _deepseek_ckpt()
    with pytest.raises(ValueError, match="supported: .*deepseek_v3"):
        load_mtp_weights(mtp, ckpt, "llama")


def test_missing_shared_head_is_named_only_when_requested():
    mtp, ckpt = _deepseek_ckpt()
    del ckpt["model.layers.3.shared_head.head.weight"]
    load_mtp_weights(mtp, ckpt, "deepseek_v3")  # the head is the target's business
    with pytest.raises(MissingTensorError, match="shared_head.head.weight"):
        load_mtp_weights(mtp, ckpt, "deepseek_v3", load_shared=True)


def test_native_strict_loader_names_the_tensor(models):
    target, _ = models
    state = {n: p.numpy() for n, p in target.named_parameters()}
    state["layers.1.mlp.up_proj.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(TensorShapeError, match=r"layers\.1\.mlp\.up_proj\.weight"):
        load_state_strict(target, state)
    del state["layers.1.mlp.up_proj.weight"]
    with pytest.raises(MissingTensorError, match=r"layers\.1\.mlp\.up_proj\.weight"):
        load_state_strict(target, state)
