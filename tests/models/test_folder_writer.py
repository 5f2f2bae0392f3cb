"""save_model_folder writes a released-layout DeepSeek-V3 folder: load_model reads back the
same parameters and config, transformers' DeepseekV3ForCausalLM gives the same logits, and
configs the folder cannot express are refused."""

import dataclasses
import json

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.models import ModelConfig, TinyTargetModel, causal_bias, load_model
from fastdeploy_mtp.models.folder_writer import save_model_folder
from fastdeploy_mtp.models.mtp_layer import build_mtp

#: Parameters that hold the padded vocabulary: (owner, name, axis of the vocabulary).
VOCAB_PARAMS = {("target", "embed_tokens.weight"): 0, ("target", "lm_head.weight"): 1}


def _config(**over) -> ModelConfig:
    fields = dict(
        model_type="deepseek_v3", vocab_size=264, ori_vocab_size=256, hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=8, intermediate_size=48,
        max_position_embeddings=128,
        num_nextn_predict_layers=1, attention_type="mla", q_lora_rank=16, kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=8, rope_interleave=True, n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16, n_shared_experts=1, n_group=2, topk_group=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True, first_k_dense_replace=1, scoring_func="sigmoid",
        topk_method="noaux_tc",
        mtp_mask_first_position=True,
    )  # fmt: skip
    fields.update(over)
    return ModelConfig(**fields)


def _random_models(config: ModelConfig, seed: int = 5):
    """Target + MTP with every parameter drawn at random (router correction biases too)."""
    paddle.seed(seed)
    target = TinyTargetModel(config)
    mtp = build_mtp(config, target)
    rng = np.random.default_rng(seed)
    for model in (target, mtp):
        for _, p in model.named_parameters():
            scale = 1.0 / np.sqrt(p.shape[0]) if len(p.shape) == 2 else 0.1
            offset = 1.0 if len(p.shape) == 1 and "bias" not in p.name else 0.0
            p.set_value((offset + scale * rng.standard_normal(p.shape)).astype("float32"))
    target.eval()
    mtp.eval()
    return target, mtp


def _saved(tmp_path, config):
    target, mtp = _random_models(config)
    save_model_folder(str(tmp_path), target, mtp, config, metrics={"note": 1})
    return target, mtp, load_model(str(tmp_path))


@pytest.mark.parametrize("q_lora_rank", [16, 0])
def test_save_then_load_model_round_trips_exactly(tmp_path, q_lora_rank):
    config = _config(q_lora_rank=q_lora_rank)
    target, mtp, (target2, mtp2, config2) = _saved(tmp_path, config)
    assert (
        dataclasses.replace(
            config2, vocab_size=config.vocab_size, ori_vocab_size=config.ori_vocab_size
        )
        == config
    )
    assert config2.vocab_size == config2.ori_vocab_size == config.ori_vocab_size
    for owner, (a, b) in {"target": (target, target2), "mtp": (mtp, mtp2)}.items():
        theirs = dict(b.named_parameters())
        assert sorted(theirs) == sorted(n for n, _ in a.named_parameters())
        for name, p in a.named_parameters():
            want = p.numpy()
            axis = VOCAB_PARAMS.get((owner, name))
            if axis is not None:
                want = np.take(want, np.arange(config.ori_vocab_size), axis=axis)
            np.testing.assert_array_equal(theirs[name].numpy(), want, err_msg=f"{owner}.{name}")
    ids = paddle.to_tensor(np.random.default_rng(1).integers(0, 256, (2, 24)))
    _, h1 = target.forward_dense(ids, causal_bias(24))
    _, h2 = target2.forward_dense(ids, causal_bias(24))
    want = target.compute_logits(h1).numpy()[..., : config.ori_vocab_size]
    np.testing.assert_array_equal(target2.compute_logits(h2).numpy(), want)
    m1 = mtp.compute_logits(mtp.forward_dense(ids[:, 1:], h1[:, :-1], causal_bias(23))).numpy()
    m2 = mtp2.compute_logits(mtp2.forward_dense(ids[:, 1:], h2[:, :-1], causal_bias(23))).numpy()
    np.testing.assert_array_equal(m2, m1[..., : config.ori_vocab_size])
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"note": 1}
    assert (tmp_path / "tokenizer.json").exists() and (tmp_path / "tokenizer_config.json").exists()


def test_folder_has_released_deepseek_v3_names(tmp_path):
    from safetensors.numpy import load_file

    config = _config()
    _saved(tmp_path, config)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert (
        raw["architectures"] == ["DeepseekV3ForCausalLM"] and raw["num_nextn_predict_layers"] == 1
    )
    names = set(load_file(str(tmp_path / "model.safetensors")))
    mtp = "model.layers.2."
    owned = (
        "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
        "embed_tokens.weight", "shared_head.head.weight", "mlp.experts.3.down_proj.weight",
        "mlp.gate.e_score_correction_bias", "self_attn.kv_a_proj_with_mqa.weight",
    )  # fmt: skip
    for name in owned:
        assert mtp + name in names, name
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names  # first_k_dense_replace = 1


def test_transformers_reads_the_folder_with_the_same_logits(tmp_path):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    config = _config()
    target, _, _ = _saved(tmp_path, config)
    hf = transformers.DeepseekV3ForCausalLM.from_pretrained(
        str(tmp_path), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = np.random.default_rng(2).integers(0, 256, (2, 20))
    with torch.no_grad():
        theirs = hf(input_ids=torch.as_tensor(ids)).logits.numpy()
    _, h = target.forward_dense(paddle.to_tensor(ids), causal_bias(20))
    ours = target.compute_logits(h).numpy()[..., : config.ori_vocab_size]
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


def test_configs_the_folder_cannot_express_are_refused(tmp_path):
    with pytest.raises(ValueError, match="mtp_hidden_state"):
        pre_norm = _config(mtp_hidden_state="pre_norm")
        save_model_folder(str(tmp_path / "a"), *_random_models(pre_norm), pre_norm)
    tiny = ModelConfig()
    with pytest.raises(ValueError, match="fastdeploy_mtp_tiny"):
        save_model_folder(str(tmp_path / "b"), *_random_models(tiny), tiny)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
