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
    spec = importlib.util.spec_from_file_location("train_tiny", os.path.join(REPO, "scripts", "train_tiny.py"))
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
        meta = make_forward_meta([len(seq)], [0], tables, caches, config.block_size, ids_remove_padding=seq)
        logits = target.compute_logits(target(meta.ids_remove_padding, meta)).numpy()
        seq.append(int(np.argmax(logits[-1])))
    assert got == seq[len(prompt) :]
    assert all(t < config.ori_vocab_size for t in got)
