"""scripts/train_tiny.py is seeded and resumable, and the serving-path scoring used for the
card agrees with the training-path evaluation."""

import importlib.util
import os

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.models import (
    causal_bias,
    contiguous_block_tables,
    greedy_generate,
    make_forward_meta,
    score_windows,
)
from tests.support.models import build_models, small_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_ARGS = [
    "--hidden-size",
    "32",
    "--layers",
    "1",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--intermediate-size",
    "48",
    "--seq-len",
    "32",
    "--batch-size",
    "4",
    "--warmup-steps",
    "100",
    "--eval-every",
    "1000",
    "--ckpt-every-sec",
    "1e9",
]


def _train_module():
    spec = importlib.util.spec_from_file_location(
        "train_tiny", os.path.join(REPO, "scripts", "train_tiny.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resumed_training_equals_uninterrupted(tmp_path):
    train = _train_module()
    train.main(["--run-dir", str(tmp_path / "a"), "--max-steps", "4"] + TINY_ARGS)
    train.main(["--run-dir", str(tmp_path / "b"), "--max-steps", "2"] + TINY_ARGS)
    train.main(["--run-dir", str(tmp_path / "b"), "--max-steps", "4"] + TINY_ARGS)
    a = paddle.load(str(tmp_path / "a" / "ckpt.pdckpt"))
    b = paddle.load(str(tmp_path / "b" / "ckpt.pdckpt"))
    assert a["step"] == b["step"] == 4
    assert a["rng"] == b["rng"]
    for part in ("target", "mtp"):
        assert sorted(a[part]) == sorted(b[part])
        for name in a[part]:
            np.testing.assert_array_equal(
                np.asarray(a[part][name]), np.asarray(b[part][name]), err_msg=f"{part}.{name}"
            )


def test_resume_with_a_different_model_shape_is_refused(tmp_path):
    train = _train_module()
    train.main(["--run-dir", str(tmp_path), "--max-steps", "1"] + TINY_ARGS)
    args = list(TINY_ARGS)
    args[args.index("--hidden-size") + 1] = "64"
    with pytest.raises(SystemExit, match="hidden_size"):
        train.main(["--run-dir", str(tmp_path), "--max-steps", "2"] + args)


def test_serving_path_score_equals_dense_loss():
    config = small_config(vocab_size=260, ori_vocab_size=256)
    target, _ = build_models(config, seed=21)
    data = np.random.default_rng(21).integers(0, 256, 3 * 24).astype(np.uint8)
    served = score_windows(target, data, window=24, num_windows=3)
    ids = paddle.to_tensor(data.astype(np.int64).reshape(3, 24))
    _, post = target.forward_dense(ids, causal_bias(24))
    logits = target.compute_logits(post)[:, :-1]
    dense = float(paddle.nn.functional.cross_entropy(logits, ids[:, 1:].unsqueeze(-1)).mean())
    assert served == pytest.approx(dense, rel=1e-5)


def test_greedy_generate_with_cache_equals_recompute():
    config = small_config()
    target, _ = build_models(config, seed=22)
    prompt = [3, 1, 4, 1, 5, 9, 2]
    got = greedy_generate(target, prompt, 9)
    seq = list(prompt)
    for _ in range(9):  # no cache: full prefill of the whole sequence
        tables, n = contiguous_block_tables([len(seq)], config.block_size)
        caches = target.attn_backend.allocate_caches(target.num_cache_layers, n)
        meta = make_forward_meta(
            [len(seq)], [0], tables, caches, config.block_size, ids_remove_padding=seq
        )
        logits = target.compute_logits(target(meta.ids_remove_padding, meta)).numpy()
        seq.append(int(np.argmax(logits[-1])))
    assert got == seq[len(prompt) :]
    assert all(t < config.ori_vocab_size for t in got)


DEEPSEEK_ARGS = [
    "--arch", "deepseek_v3", "--hidden-size", "32", "--layers", "2", "--heads", "2",
    "--intermediate-size", "48",
    "--kv-lora-rank", "16", "--qk-nope-head-dim", "8", "--qk-rope-head-dim", "8", "--v-head-dim",
    "8",
    "--experts", "4", "--experts-per-tok", "2", "--moe-intermediate-size", "16", "--seq-len", "32",
    "--batch-size", "2", "--warmup-steps", "1", "--eval-every", "1000", "--ckpt-every-sec", "1e9",
    "--mtp-depth", "2", "--distill",
]  # fmt: skip


def test_deepseek_v3_arch_trains_router_with_frozen_bias_and_exports(tmp_path):
    from fastdeploy_mtp.models import load_model

    train = _train_module()
    train.main(["--run-dir", str(tmp_path / "r"), "--max-steps", "2"] + DEEPSEEK_ARGS)
    state = paddle.load(str(tmp_path / "r" / "ckpt.pdckpt"))
    biases = [
        k
        for part in ("target", "mtp")
        for k in state[part]
        if k.endswith("e_score_correction_bias")
    ]
    assert len(biases) == 2  # target layer 1 and the MTP layer's block
    for part in ("target", "mtp"):
        for name, value in state[part].items():
            if name.endswith("e_score_correction_bias"):
                np.testing.assert_array_equal(np.asarray(value), 0.0)
    train.main(["--run-dir", str(tmp_path / "init"), "--max-steps", "0"] + DEEPSEEK_ARGS)
    init = paddle.load(str(tmp_path / "init" / "ckpt.pdckpt"))
    for part, name in (
        ("target", "layers.1.mlp.gate.weight"),
        ("mtp", "mtp_block.mlp.gate.weight"),
    ):
        assert not np.allclose(np.asarray(state[part][name]), np.asarray(init[part][name])), name
    args = train.parse_args(["--run-dir", str(tmp_path / "r")] + DEEPSEEK_ARGS)
    config = train.train_arch.build_config(args)
    target, mtp = build_models(config, seed=0)
    target.set_state_dict(state["target"])
    mtp.set_state_dict(state["mtp"])
    train.train_arch.save_folder(str(tmp_path / "out"), target, mtp, config, {"steps": 2})
    target2, mtp2, config2 = load_model(str(tmp_path / "out"))
    assert config2.model_type == "deepseek_v3" and config2.vocab_size == 257  # bytes + EOT
    assert config2.eos_token_ids == [256]
    ours = dict(mtp2.named_parameters())
    for name, p in mtp.named_parameters():
        np.testing.assert_array_equal(ours[name].numpy(), p.numpy(), err_msg=name)
    bad = list(DEEPSEEK_ARGS)
    bad[bad.index("--experts") + 1] = "8"
    with pytest.raises(SystemExit, match="experts"):
        train.main(["--run-dir", str(tmp_path / "r"), "--max-steps", "3"] + bad)
