"""The reference fixtures themselves: the folders load in transformers, their reference
outputs are finite and consistent with each other and with the saved tensors, and the MTP
tensors carry the released names."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch  # noqa: E402

# transformers (and torch) are test dependencies (`.[test]`): the comparison must run, never skip
import transformers  # noqa: E402, F401
from safetensors.numpy import load_file  # noqa: E402

from tests.support import hf_folders as hf  # noqa: E402

IDS = np.array([[5, 17, 200, 33, 99, 7, 250, 1], [3, 3, 140, 66, 12, 298, 41, 8]])
BLOCK = [
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]
EXTRA_BLOCK = {
    "llama": [],
    "qwen2": ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"],
    "qwen3": ["self_attn.q_norm.weight", "self_attn.k_norm.weight"],
}
EXTRA_BLOCK["mimo"] = EXTRA_BLOCK["qwen2"]


def expected_mtp_names(family: str, n_layers: int, n_mtp: int) -> set[str]:
    """The released names, written out here independently of hf_folders' renames."""
    names = set()
    for k in range(n_mtp):
        if family == "mimo":
            prefix, own = (
                f"model.mtp_layers.{k}.",
                ["token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm"],
            )
        else:
            prefix, own = (
                f"model.layers.{n_layers + k}.",
                ["enorm", "hnorm", "eh_proj", "shared_head.norm"],
            )
        names |= {prefix + o + ".weight" for o in own}
        names |= {prefix + b for b in BLOCK + EXTRA_BLOCK[family]}
    return names


def all_tensors(folder) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module", params=hf.FAMILIES)
def folder(request, tmp_path_factory):
    return hf.make_folder(tmp_path_factory.mktemp(request.param), request.param, num_mtp_layers=2)


def test_config_and_generation_config(folder):
    cfg = json.loads((folder.path / "config.json").read_text())
    assert cfg["architectures"] == [hf.ARCHITECTURES[folder.family]]
    assert cfg["model_type"] == folder.family
    assert cfg["num_nextn_predict_layers"] == 2
    assert "num_mtp_layers" not in cfg and "mtp_layer_types" not in cfg
    assert cfg["rope_parameters"]["rope_theta"] == hf._ROPE_THETA[folder.family]
    if folder.family == "qwen3":
        assert cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]
    gen = json.loads((folder.path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 0] and cfg["eos_token_id"] == 2
    assert (gen["temperature"], gen["top_p"], gen["top_k"]) == (0.7, 0.9, 20)


def test_saved_tensors_have_the_released_names_and_an_index(folder):
    tensors = all_tensors(folder.path)
    expected = expected_mtp_names(folder.family, 2, 2)
    assert set(folder.mtp_tensor_names) == expected
    assert set(tensors) == expected | set(folder.target_tensor_names)
    assert folder.sharded == (folder.family in ("qwen3", "mimo"))
    if folder.sharded:
        index = json.loads((folder.path / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(tensors)
        for name, file in index["weight_map"].items():
            assert name in load_file(str(folder.path / file))
        assert len(set(index["weight_map"].values())) > 2
    else:
        assert not (folder.path / "model.safetensors.index.json").exists()
    for name, t in tensors.items():
        assert np.isfinite(t).all() and t.std() > 0, name


def test_reference_logits_are_the_head_over_the_final_hidden(folder):
    logits = hf.reference_logits(folder.path, IDS)
    hidden = hf.reference_hidden(folder.path, IDS)
    assert logits.shape == (2, 8, 300) and logits.dtype == np.float32
    assert hidden.shape == (2, 8, 64)
    assert np.isfinite(logits).all() and np.isfinite(hidden).all()
    # the same tensor transformers' MTP candidate generator takes (hidden_states[-1])
    target, _ = hf.load_reference(folder.path)
    with torch.no_grad():
        last = target(input_ids=torch.tensor(IDS), output_hidden_states=True).hidden_states[-1]
    np.testing.assert_array_equal(last.numpy(), hidden)
    head = all_tensors(folder.path)["lm_head.weight"]
    np.testing.assert_allclose(logits, hidden @ head.T, rtol=1e-4, atol=1e-4)
    # causal: the first row's prefix does not see what follows
    short = hf.reference_logits(folder.path, IDS[:, :5])
    np.testing.assert_allclose(short, logits[:, :5], rtol=1e-5, atol=1e-5)


def test_reference_mtp_uses_the_saved_weights_in_the_released_order(folder):
    _, mtp = hf.load_reference(folder.path)
    tensors = all_tensors(folder.path)
    prefix = "model.mtp_layers.1." if folder.family == "mimo" else "model.layers.3."
    proj = "input_proj" if folder.family == "mimo" else "eh_proj"
    np.testing.assert_array_equal(
        mtp.layers[1].eh_proj.weight.detach().numpy(), tensors[prefix + proj + ".weight"]
    )
    # the projection input, by hand from the saved tensors: MiMo puts the hidden state first
    hidden = hf.reference_hidden(folder.path, IDS)
    captured = {}
    handle = mtp.layers[1].eh_proj.register_forward_hook(
        lambda m, args, out: captured.update(x=args[0])
    )
    try:
        logits, out = hf.reference_mtp_step(folder.path, 1, IDS, hidden)
    finally:
        handle.remove()
    eps = hf._RMS_EPS[folder.family]

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    embed = tensors["model.embed_tokens.weight"][IDS]
    if folder.family == "mimo":
        e, h = (
            rms(embed, tensors[prefix + "token_layernorm.weight"]),
            rms(hidden, tensors[prefix + "hidden_layernorm.weight"]),
        )
        want = np.concatenate([h, e], -1)
    else:
        e, h = (
            rms(embed, tensors[prefix + "enorm.weight"]),
            rms(hidden, tensors[prefix + "hnorm.weight"]),
        )
        want = np.concatenate([e, h], -1)
    np.testing.assert_allclose(captured["x"].numpy(), want, rtol=1e-4, atol=1e-5)
    assert logits.shape == (2, 8, 300) and out.shape == (2, 8, 64)
    assert np.isfinite(logits).all() and np.isfinite(out).all()
    np.testing.assert_allclose(logits, out @ tensors["lm_head.weight"].T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(hf.reference_mtp_logits(folder.path, 1, IDS, hidden), logits)
    with pytest.raises(ValueError, match="layer"):
        hf.reference_mtp_step(folder.path, 2, IDS, hidden)


def test_reference_greedy_matches_argmax_and_can_stop_at_eos(folder, tmp_path):
    tokens = hf.reference_greedy(folder.path, [5, 17, 200], 6)
    ids = [5, 17, 200]
    for _ in range(6):
        ids.append(int(hf.reference_logits(folder.path, [ids])[0, -1].argmax()))
    assert tokens == ids[3:]
    # a folder whose eos is the greedy path's third token stops there when asked
    other = hf.make_folder(
        tmp_path / "eos", folder.family, num_mtp_layers=0, eos_token_ids=(tokens[2], 299)
    )
    assert hf.reference_greedy(other.path, [5, 17, 200], 6) == tokens
    assert (
        hf.reference_greedy(other.path, [5, 17, 200], 6, stop_at_eos=True)
        == tokens[: tokens.index(tokens[2]) + 1]
    )


@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3"])
def test_rope_scaling_reaches_the_reference(rope_type, tmp_path):
    plain = hf.make_folder(tmp_path / "plain", "llama", num_mtp_layers=0)
    scaled = hf.make_folder(
        tmp_path / "scaled", "llama", num_mtp_layers=0, rope_scaling=hf.rope_example(rope_type)
    )
    assert scaled.config["rope_parameters"]["rope_type"] == rope_type
    base, got = hf.reference_logits(plain.path, IDS), hf.reference_logits(scaled.path, IDS)
    assert np.isfinite(got).all()
    # position 0 has no rotation; later positions change with the scaled frequencies
    np.testing.assert_allclose(got[:, 0], base[:, 0], rtol=1e-4, atol=1e-4)
    assert np.abs(got[:, 1:] - base[:, 1:]).max() > 1e-3


def test_dynamic_rope_below_the_original_length_is_plain_rope(tmp_path):
    plain = hf.make_folder(tmp_path / "plain", "qwen3", num_mtp_layers=0)
    dyn = hf.make_folder(
        tmp_path / "dyn", "qwen3", num_mtp_layers=0, rope_scaling=hf.rope_example("dynamic")
    )
    assert dyn.config["rope_parameters"] == {
        "rope_type": "dynamic",
        "factor": 2.0,
        "rope_theta": 1000000.0,
    }
    np.testing.assert_allclose(
        hf.reference_logits(dyn.path, IDS), hf.reference_logits(plain.path, IDS), atol=1e-5
    )


@pytest.mark.parametrize("family", ["qwen3", "mimo"])
def test_legacy_config_is_the_same_model(family, tmp_path):
    rope = hf.rope_example("yarn")
    new = hf.make_folder(tmp_path / "new", family, rope_scaling=rope)
    old = hf.make_folder(tmp_path / "old", family, rope_scaling=rope, legacy_config=True)
    cfg = old.config
    assert "rope_parameters" not in cfg and "dtype" not in cfg
    assert cfg["rope_theta"] == hf._ROPE_THETA[family] and cfg["torch_dtype"] == "float32"
    assert cfg["rope_scaling"]["type"] == "yarn" and cfg["rope_scaling"]["factor"] == 2.0
    np.testing.assert_array_equal(
        hf.reference_logits(old.path, IDS), hf.reference_logits(new.path, IDS)
    )
    hidden = hf.reference_hidden(new.path, IDS)
    np.testing.assert_array_equal(
        hf.reference_mtp_logits(old.path, 0, IDS, hidden),
        hf.reference_mtp_logits(new.path, 0, IDS, hidden),
    )


def test_tied_head_is_not_saved_and_is_the_embedding(tmp_path):
    info = hf.make_folder(tmp_path / "tied", "qwen3", tie=True)
    tensors = all_tensors(info.path)
    assert "lm_head.weight" not in tensors and info.config["tie_word_embeddings"] is True
    logits, hidden = hf.reference_logits(info.path, IDS), hf.reference_hidden(info.path, IDS)
    np.testing.assert_allclose(
        logits, hidden @ tensors["model.embed_tokens.weight"].T, rtol=1e-4, atol=1e-4
    )
    mtp_logits, out = hf.reference_mtp_step(info.path, 0, IDS, hidden)
    np.testing.assert_allclose(
        mtp_logits, out @ tensors["model.embed_tokens.weight"].T, rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_folders(dtype, tmp_path):
    from safetensors import safe_open

    info = hf.make_folder(tmp_path / dtype, "llama", dtype=dtype)
    assert info.config["dtype"] == dtype
    with safe_open(str(info.path / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {f"torch.{dtype}"}
    f32 = hf.make_folder(tmp_path / "f32", "llama")
    got, want = hf.reference_logits(info.path, IDS), hf.reference_logits(f32.path, IDS)
    assert np.isfinite(got).all() and np.abs(got - want).max() < 0.1


def test_bias_and_no_mtp(tmp_path):
    info = hf.make_folder(tmp_path / "b", "llama", bias=True, num_mtp_layers=0)
    names = set(info.target_tensor_names)
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.o_proj.bias"} <= names
    assert all(t.std() > 0 for n, t in all_tensors(info.path).items() if n.endswith(".bias"))
    assert "num_nextn_predict_layers" not in info.config and info.mtp_tensor_names == ()
    assert not (info.path / "model.safetensors.index.json").exists()
    assert hf.load_reference(info.path)[1] is None
    with pytest.raises(ValueError, match="no MTP layers"):
        hf.reference_mtp_step(info.path, 0, IDS, hf.reference_hidden(info.path, IDS))


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="bias"):
        hf.make_folder(tmp_path / "q2", "qwen2", bias=False)
    with pytest.raises(ValueError, match="family"):
        hf.make_folder(tmp_path / "x", "gpt2")
    with pytest.raises(ValueError, match="rope_type"):
        hf.rope_example("ntk")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="out_dir"):
        hf.make_folder(tmp_path / "full", "llama")


def test_tokenizer_writer_runs_last(tmp_path):
    seen = []
    hf.make_folder(
        tmp_path / "t",
        "qwen2",
        tokenizer_writer=lambda out: seen.append(sorted(p.name for p in out.iterdir())),
    )
    assert seen == [["config.json", "generation_config.json", "model.safetensors"]]


def test_big_folder_is_sharded_and_loads(tmp_path):
    from transformers import Qwen3ForCausalLM

    info = hf.make_big_folder(tmp_path / "big", 40, shard_mb=20)
    files = sorted(p.name for p in info.path.glob("*.safetensors"))
    assert len(files) >= 3 and all(
        (info.path / f).stat().st_size <= 20 * 2**20 + 2**16 for f in files
    )
    total = sum((info.path / f).stat().st_size for f in files)
    assert 30 * 2**20 < total < 50 * 2**20
    index = json.loads((info.path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files and set(index["weight_map"]) == set(
        info.target_tensor_names
    )
    model = Qwen3ForCausalLM.from_pretrained(str(info.path), dtype=torch.float32)
    assert model.config.num_hidden_layers == info.num_hidden_layers
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.tensor(IDS)).logits).all()


def test_cli_writes_the_same_folder(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "make_hf_folder", Path(__file__).parents[2] / "scripts/make_hf_folder.py"
    )
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert (
        cli.main(
            [
                "--family",
                "qwen3",
                "--out",
                str(tmp_path / "cli"),
                "--mtp-layers",
                "2",
                "--rope-type",
                "yarn",
            ]
        )
        == 0
    )
    direct = hf.make_folder(
        tmp_path / "direct", "qwen3", num_mtp_layers=2, rope_scaling=hf.rope_example("yarn")
    )
    assert json.loads((tmp_path / "cli" / "config.json").read_text()) == direct.config
    assert hf._saved_names(tmp_path / "cli") == hf._saved_names(direct.path)
