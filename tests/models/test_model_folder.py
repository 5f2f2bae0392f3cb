"""Model-folder loading: refusals (one line, before any weight is read), dtype handling,
tensor-parallel slicing, the shipped checkpoint as a folder, and peak memory while loading."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import paddle
import pytest

# transformers (and torch) are test dependencies (`.[test]`): the comparison must run, never skip
import transformers  # noqa: E402, F401
from safetensors.numpy import load_file, save_file  # noqa: E402

from fastdeploy_mtp.models import (  # noqa: E402
    ASSETS_DIR,
    UnsupportedModelError,
    folder_inspection,
    inspect_model_folder,
    load_model,
    load_tiny,
    model_folder,
)
from tests.support import hf_folders  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return hf_folders.make_folder(
        tmp_path_factory.mktemp("llama"), "llama", num_mtp_layers=1, sharded=False
    ).path


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    return hf_folders.make_folder(
        tmp_path_factory.mktemp("qwen3"), "qwen3", num_mtp_layers=1, tie=True
    ).path


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Fail the test if any tensor data is read."""

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read before the folder was refused")

    monkeypatch.setattr(model_folder, "tensor_view", refuse)


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "folder"
    shutil.copytree(src, dst)
    return dst


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def edit_tensors(folder: Path, edit) -> None:
    path = str(folder / "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def refusal(folder: Path, pattern: str) -> str:
    with pytest.raises(UnsupportedModelError, match=pattern) as info:
        load_model(folder)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"model folder {folder}: ")
    with pytest.raises(UnsupportedModelError, match=pattern):
        inspect_model_folder(folder)
    return message


CONFIG_REFUSALS = {
    "architecture": (
        {"architectures": ["GPT2LMHeadModel"]},
        r"`architectures` 'GPT2LMHeadModel' is not supported; supported: "
        r"\['DeepseekV3ForCausalLM', "
        r"'Ernie4_5ForCausalLM', 'Ernie4_5_MoeForCausalLM', 'FastDeployMTPTinyForCausalLM', "
        r"'Glm4MoeForCausalLM', "
        r"'LlamaForCausalLM', 'MiMoForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM', "
        r"'Qwen3NextForCausalLM', 'Qwen3_5ForCausalLM'\]",
    ),
    "no_architectures": ({"architectures": None}, r"config.json has no `architectures` list"),
    "hidden_act": ({"hidden_act": "gelu"}, r"`hidden_act` 'gelu' is not supported; only 'silu'"),
    "mlp_bias": ({"mlp_bias": True}, r"`mlp_bias` true is not supported"),
    "sliding_window": ({"use_sliding_window": True}, r"`use_sliding_window` true is not supported"),
    "layer_types": (
        {"layer_types": ["sliding_attention", "full_attention"]},
        r"`layer_types` has sliding-window layers",
    ),
    "rope_type": (
        {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
        r"`rope_parameters.rope_type` 'longrope' is not supported",
    ),
    "legacy_rope_type": (
        {"rope_parameters": None, "rope_scaling": {"type": "su", "factor": 2.0}},
        r"`rope_scaling.rope_type` 'su' is not supported",
    ),
    "missing_key": ({"intermediate_size": None}, r"config.json has no `intermediate_size`"),
    "not_an_integer": (
        {"hidden_size": "64"},
        r"config.json `hidden_size` must be an integer, got '64'",
    ),
    "not_a_flag": (
        {"tie_word_embeddings": "yes"},
        r"config.json `tie_word_embeddings` must be true or false",
    ),
    "rope_factor": (
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 0}},
        r"config.json `rope_parameters.factor` must be a number > 0, got 0",
    ),
    "rope_missing_factor": (
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
        r"config.json `rope_parameters.factor` is required for rope_type 'yarn'",
    ),
    "llama3_freq_factors": (
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 1e4,
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            }
        },
        r"`rope_parameters.high_freq_factor` must be above `low_freq_factor`",
    ),
    "layer_types_not_a_list": (
        {"layer_types": 3},
        r"config.json `layer_types` must be a list, got 3",
    ),
    "dtype": ({"dtype": "float64"}, r"config.json `dtype` 'float64' is not supported"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSALS))
def test_config_refusals_name_the_key(case, llama_dir, tmp_path, no_weight_reads):
    changes, pattern = CONFIG_REFUSALS[case]
    folder = copy_of(llama_dir, tmp_path)
    edit_config(folder, **changes)
    refusal(folder, pattern)


def test_missing_files_are_refused(llama_dir, sharded_dir, tmp_path, no_weight_reads):
    folder = copy_of(llama_dir, tmp_path / "a")
    (folder / "config.json").unlink()
    refusal(folder, r"no config.json$")
    folder = copy_of(llama_dir, tmp_path / "b")
    (folder / "model.safetensors").unlink()
    refusal(folder, r"no model.safetensors or model.safetensors.index.json$")
    folder = copy_of(sharded_dir, tmp_path / "c")
    (folder / hf_folders.MTP_SHARD).unlink()
    refusal(
        folder, rf"shard {hf_folders.MTP_SHARD} named in model.safetensors.index.json is missing"
    )
    refusal(tmp_path / "nowhere", r"not a directory$")


def test_tensor_refusals(llama_dir, tmp_path, no_weight_reads):
    folder = copy_of(llama_dir, tmp_path / "a")
    edit_tensors(folder, lambda t: t.__setitem__("model.norm.weight", np.ones([3], np.float32)))
    refusal(folder, r"tensor 'model.norm.weight' has shape \[3\], expected \[64\]")
    folder = copy_of(llama_dir, tmp_path / "b")
    edit_tensors(folder, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    refusal(
        folder,
        r"tensor 'model.layers.1.mlp.down_proj.weight' is missing \(expected shape \[64, 128\]\)",
    )
    folder = copy_of(llama_dir, tmp_path / "c")
    edit_tensors(
        folder, lambda t: t.__setitem__("model.layers.0.mlp.experts.0.w1", np.ones([2], np.float32))
    )
    refusal(folder, r"tensor 'model.layers.0.mlp.experts.0.w1' is not used by a llama model")
    folder = copy_of(llama_dir, tmp_path / "d")
    edit_config(folder, num_nextn_predict_layers=None)  # the MTP layer's tensors are left over
    refusal(folder, r"tensor 'model.layers.2.eh_proj.weight' is not used by a llama model")


def _rewrite_header(path: Path, edit) -> None:
    """Replace the JSON header of safetensors file ``path`` by ``edit(header)`` (data kept)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = edit(json.loads(data[8 : 8 + size]))
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + size :])


def test_damaged_weight_files_are_refused_before_loading(llama_dir, tmp_path, no_weight_reads):
    def damaged(name: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(llama_dir, folder)
        return folder

    truncated = damaged("truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a download cut short
    message = refusal(
        truncated, r"model\.safetensors: tensor '.*' ends at byte \d+, past the end of the file"
    )
    assert "truncated?" in message

    not_json = damaged("not_json")
    _rewrite_header(not_json / "model.safetensors", lambda h: b"{not json" + b" " * 10)
    refusal(not_json, r"model\.safetensors: header is not valid JSON")

    wrong_length = damaged("wrong_length")

    def shrink(header: dict) -> dict:
        meta = header["model.norm.weight"]
        meta["data_offsets"] = [meta["data_offsets"][0], meta["data_offsets"][1] - 4]
        return header

    _rewrite_header(wrong_length / "model.safetensors", shrink)
    refusal(wrong_length, r"tensor 'model\.norm\.weight' has \d+ bytes for shape \[64\] of F32")

    no_offsets = damaged("no_offsets")

    def drop(header: dict) -> dict:
        del header["model.norm.weight"]["data_offsets"]
        return header

    _rewrite_header(no_offsets / "model.safetensors", drop)
    refusal(no_offsets, r"tensor 'model\.norm\.weight' has no valid dtype, shape and data_offsets")

    huge_header = damaged("huge_header")
    weights = huge_header / "model.safetensors"
    weights.write_bytes((2**40).to_bytes(8, "little") + weights.read_bytes()[8:])
    refusal(huge_header, r"header of \d+ bytes runs past the end of the file")


def test_half_precision_folder_runs_as_float32_on_cpu_unless_asked_for_explicitly(tmp_path):
    info = hf_folders.make_folder(tmp_path / "bf16", "qwen2", num_mtp_layers=0, dtype="bfloat16")
    assert inspect_model_folder(info.path, dtype="float32").dtype == "float32"
    if paddle.get_device().startswith("cpu"):
        # auto: the config's bfloat16 has no CPU matmul, so it is widened, and the plan says so
        plan = folder_inspection.inspect_folder(info.path)
        assert plan.config.dtype == "float32"
        assert plan.note is not None and "bfloat16 weights run as float32" in plan.note
        # asked for explicitly: refused before any weight is read
        with pytest.raises(
            UnsupportedModelError, match=r"dtype 'bfloat16' needs a GPU .* dtype='float32'"
        ):
            inspect_model_folder(info.path, dtype="bfloat16")
        with pytest.raises(UnsupportedModelError, match=r"dtype 'bfloat16' needs a GPU"):
            load_model(info.path, dtype="bfloat16")
    else:
        assert inspect_model_folder(info.path).dtype == "bfloat16"
    target, _, config = load_model(info.path)  # compared with transformers in test_families
    assert config.dtype == "float32" and target.embed_tokens.weight.dtype == paddle.float32


def test_tensor_parallel_ranks_hold_their_slices(sharded_dir):
    full_target, full_mtp, config = load_model(sharded_dir)
    assert config.tie_word_embeddings and config.qk_norm
    for rank in (0, 1):
        target, mtp, _ = load_model(sharded_dir, tensor_parallel_size=2, tensor_parallel_rank=rank)
        for whole, shard in ((full_target, target), (full_mtp, mtp)):
            axes = model_folder.shard_axes(shard)
            for name, param in shard.named_parameters():
                want = dict(whole.named_parameters())[name].numpy()
                if name in axes:
                    want = np.split(want, 2, axis=axes[name])[rank]
                np.testing.assert_array_equal(param.numpy(), want, err_msg=name)
        # tied: the head reads this rank's embedding rows, the same slice a separate head holds
        assert target.lm_head.weight is target.embed_tokens.weight


def test_shipped_checkpoint_is_a_model_folder():
    config = inspect_model_folder(ASSETS_DIR)
    assert config.model_type == "fastdeploy_mtp_tiny" and config.num_nextn_predict_layers == 1
    target, mtp, _ = load_tiny()
    via_folder, mtp2, _ = load_model(ASSETS_DIR)
    for a, b in ((target, via_folder), (mtp, mtp2)):
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)


def test_progress_bar_per_shard(sharded_dir, capfd):
    load_model(sharded_dir, progress=True)
    err = capfd.readouterr().err
    shards = len(
        set(
            json.loads((sharded_dir / "model.safetensors.index.json").read_text())[
                "weight_map"
            ].values()
        )
    )
    assert f"{shards}/{shards}" in err and "loading shards" in err


def write_big_folder(
    out: Path, layers: int = 4, hidden: int = 1024, inter: int = 2816, vocab: int = 4096
) -> int:
    """A random float32 llama folder, one shard per decoder layer plus one for the rest;
    returns its weight bytes."""
    rng = np.random.default_rng(0)
    heads, kv, hd = 16, 8, 64
    cfg = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=hidden,
        intermediate_size=inter,
    )
    cfg.update(
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
    )
    cfg.update(
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e4, torch_dtype="float32"
    )
    (out / "config.json").write_text(json.dumps(cfg))

    def mat(*shape):
        return rng.random(shape, dtype=np.float32) - 0.5

    shards = [
        {"model.embed_tokens.weight": mat(vocab, hidden), "lm_head.weight": mat(vocab, hidden)}
    ]
    shards[0]["model.norm.weight"] = np.ones([hidden], np.float32)
    for i in range(layers):
        p = f"model.layers.{i}."
        shard = {p + "input_layernorm.weight": np.ones([hidden], np.float32)}
        shard[p + "post_attention_layernorm.weight"] = np.ones([hidden], np.float32)
        for name, rows in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            shard[p + f"self_attn.{name}.weight"] = mat(rows, hidden)
        shard[p + "self_attn.o_proj.weight"] = mat(hidden, heads * hd)
        shard[p + "mlp.gate_proj.weight"] = mat(inter, hidden)
        shard[p + "mlp.up_proj.weight"] = mat(inter, hidden)
        shard[p + "mlp.down_proj.weight"] = mat(hidden, inter)
        shards.append(shard)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        name = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name))
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(a.nbytes for a in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


#: Run in a fresh interpreter: RSS after the imports, then load_model, then the high-water mark.
#: The peak is /proc/self/status VmHWM, the address space's own maximum: getrusage's ru_maxrss
#: is carried across exec, so in a child of a large pytest process it reports the parent's size.
MEASURE = textwrap.dedent(
    """
    import json, sys, time
    import paddle
    from fastdeploy_mtp.models import load_model

    def status_kb(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])

    base = status_kb("VmRSS")
    t0 = time.perf_counter()
    target, mtp, config = load_model(sys.argv[1], progress=False)
    seconds = time.perf_counter() - t0
    peak = status_kb("VmHWM")
    layers = config.num_hidden_layers
    print(json.dumps({"base_kb": base, "peak_kb": peak, "seconds": seconds, "layers": layers}))
    """
)


def test_peak_memory_while_loading_a_sharded_folder(tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    weight_bytes = write_big_folder(folder)
    assert weight_bytes >= 200e6
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", MEASURE, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    above = (got["peak_kb"] - got["base_kb"]) * 1024
    print(
        f"\nload_model: {weight_bytes / 1e6:.0f} MB of float32 weights in {got['seconds']:.2f} s; "
        f"peak RSS {above / 1e6:.0f} MB above the post-import baseline "
        f"({above / weight_bytes:.2f}x the weights)"
    )
    assert got["layers"] == 4
    assert above < 1.3 * weight_bytes


def test_model_config_load_json_reads_tiny_folders_only(llama_dir):
    from fastdeploy_mtp.models import ModelConfig

    assert ModelConfig.load_json(str(Path(ASSETS_DIR) / "config.json")) == inspect_model_folder(
        ASSETS_DIR
    )
    with pytest.raises(
        ValueError, match=r"`model_type` 'llama' is not 'fastdeploy_mtp_tiny'; read it with"
    ):
        ModelConfig.load_json(str(llama_dir / "config.json"))


def test_duplicate_embedding_and_head_in_deepseek_style_mtp_layer_are_skipped(llama_dir, tmp_path):
    folder = copy_of(llama_dir, tmp_path)

    def add_copies(tensors):
        tensors["model.layers.2.embed_tokens.weight"] = tensors["model.embed_tokens.weight"] + 1.0
        tensors["model.layers.2.shared_head.head.weight"] = tensors["lm_head.weight"] + 1.0

    edit_tensors(folder, add_copies)
    target, mtp, _ = load_model(folder)
    original, _, _ = load_model(llama_dir)
    np.testing.assert_array_equal(
        target.embed_tokens.weight.numpy(), original.embed_tokens.weight.numpy()
    )
    np.testing.assert_array_equal(target.lm_head.weight.numpy(), original.lm_head.weight.numpy())


def test_half_precision_parameters_are_filled_from_any_stored_dtype(tmp_path):
    info = hf_folders.make_folder(
        tmp_path / "f16", "llama", num_mtp_layers=1, dtype="float16", sharded=True
    )
    # bfloat16 parameters build on the CPU (only their matmul is missing), so the filling is
    # testable here
    plan = folder_inspection.inspect_folder(info.path, dtype="float32")
    target, mtp = model_folder.build_models(dataclasses.replace(plan.config, dtype="bfloat16"))
    owners = {"target": dict(target.named_parameters()), "mtp": dict(mtp.named_parameters())}
    assert {p.dtype for ps in owners.values() for p in ps.values()} == {paddle.bfloat16}
    for ref in plan.refs:
        param = owners[ref.owner][ref.ours]
        model_folder.fill_parameter(param, plan.tensors[ref.ckpt], ref, None, 1, 0)
        stored = model_folder.tensor_view(plan.tensors[ref.ckpt], ref, None, 1, 0).astype(
            np.float32
        )
        want = paddle.to_tensor(stored).astype("bfloat16").astype("float32").numpy()
        np.testing.assert_array_equal(param.astype("float32").numpy(), want, err_msg=ref.ckpt)
