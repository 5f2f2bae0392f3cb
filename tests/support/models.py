"""Helpers shared by the model tests: tiny seeded configs and models with non-trivial
weights, and the shipped checkpoints with the metrics their cards quote."""

import hashlib
import json
import os

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.models import MTPLayer, TinyTargetModel, load_model, score_windows
from fastdeploy_mtp.models.corpus import is_heldout, stdlib_dir
from tests.support.engines import tiny_arch


def small_config(**overrides):
    """Tiny shapes so the whole directory runs in seconds: the engine tests' H=32, 4 q heads,
    2 kv heads (head_dim 8), with vocab 40 padded from 37, SwiGLU width 48, block size 4 and
    a 512-position RoPE table; `overrides` replace any field."""
    small = dict(
        vocab_size=40,
        ori_vocab_size=37,
        intermediate_size=48,
        block_size=4,
        max_position_embeddings=512,
    )
    return tiny_arch(**{**small, **overrides})


def randomize(layer, seed):
    """Give every parameter seeded random values (norm weights around 1) so that bugs in
    any parameter's use show up."""
    rng = np.random.default_rng(seed)
    for name, p in sorted(layer.named_parameters()):
        shape = list(p.shape)
        if len(shape) == 1 and "bias" not in name:
            value = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) * (0.5 / np.sqrt(shape[0]))
        p.set_value(value.astype(np.float32))


def build_models(config, seed=0):
    paddle.seed(seed)
    target = TinyTargetModel(config)
    mtp = MTPLayer(config, target)
    randomize(target, seed)
    randomize(mtp, seed + 1)
    target.eval()
    mtp.eval()
    return target, mtp


def load_shipped(folder):
    """(target, mtp, config, metrics) of a shipped checkpoint folder: its models and the
    ``metrics.json`` its card quotes."""
    with open(os.path.join(folder, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    return (*load_model(folder), metrics)


def rescore_heldout_prefix(target, metrics) -> float:
    """The loss of ``target`` on the held-out prefix the card scored (``fixed_prefix_score``
    of ``metrics``); skips the test when this Python's copy of the file differs."""
    fp = metrics["fixed_prefix_score"]
    assert is_heldout(fp["file"])
    path = os.path.join(stdlib_dir(), fp["file"])
    data = np.fromfile(path, dtype=np.uint8)[: fp["bytes"]]
    if hashlib.sha256(data.tobytes()).hexdigest() != fp["sha256"]:
        pytest.skip(
            f"{path} differs from the file scored for the card (Python "
            f"{metrics['corpus']['python_version']}); the corpus is version-specific"
        )
    return score_windows(target, data, fp["window"], fp["windows"])
