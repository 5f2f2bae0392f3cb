"""The depth-unrolled MTP training path: its mask, depth 1 = the plain dense path, and the
distinct-layer stack (save, load, forward by layer)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.models import ModelConfig, TinyTargetModel, causal_bias, load_tiny, save_tiny
from fastdeploy_mtp.models.mtp_layer import MTPLayer, MTPStack, build_mtp, mtp_layers_of
from fastdeploy_mtp.models.mtp_unrolled import depth_bias, unrolled_mtp_forward
from tests.support.models import small_config


def small(layers=1):
    paddle.seed(7)
    cfg = small_config(ori_vocab_size=36, num_hidden_layers=1, num_nextn_predict_layers=layers)
    target = TinyTargetModel(cfg)
    return cfg, target, build_mtp(cfg, target)


def test_depth_bias_pattern():
    allowed = depth_bias(5, 3).numpy() == 0
    # depth-3 query at p = 3: depth-1 keys <= 1, depth-2 key 2, depth-3 key 3
    assert allowed[3].tolist() == [True, True, False, False, False] + [
        False,
        False,
        True,
        False,
        False,
    ] + [
        False,
        False,
        False,
        True,
        False,
    ]
    assert allowed[0, 0]  # no complete chain: still sees depth-1 key 0, so the softmax is finite
    assert (depth_bias(4, 1).numpy() == 0).tolist() == np.tril(np.ones((4, 4), bool)).tolist()
    with pytest.raises(ValueError, match="depth"):
        depth_bias(4, 0)


def test_depth_one_equals_the_dense_path():
    _, target, mtp = small()
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 36, (2, 12)))
    pre, post = target.forward_dense(ids, causal_bias(12))
    h = target.mtp_hidden(pre, post)
    (out,) = unrolled_mtp_forward([mtp], ids[:, 1:], h[:, :-1], 1)
    want = mtp.forward_dense(ids[:, 1:], h[:, :-1], causal_bias(11))
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_deeper_rows_depend_only_on_their_chain():
    """Changing the token at position q changes depth-k rows only from q on (no look-ahead)."""
    _, target, mtp = small(layers=3)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 36, (1, 14))
    b = a.copy()
    b[0, 9] = (a[0, 9] + 1) % 36
    outs = []
    for ids in (a, b):
        t = paddle.to_tensor(ids)
        pre, post = target.forward_dense(t, causal_bias(14))
        h = target.mtp_hidden(pre, post)
        outs.append(
            [o.numpy() for o in unrolled_mtp_forward(mtp_layers_of(mtp), t[:, 1:], h[:, :-1], 3)]
        )
    for k in range(3):
        # row p consumes token p + 1: rows < 8 never see position 9
        np.testing.assert_allclose(outs[0][k][:, :8], outs[1][k][:, :8], rtol=1e-5, atol=1e-6)
        assert not np.allclose(outs[0][k][:, 8:], outs[1][k][:, 8:])


def test_stack_saves_and_loads(tmp_path):
    cfg, target, stack = small(layers=3)
    assert isinstance(stack, MTPStack) and stack.num_cache_layers == 3
    assert [layer.cache_layer for layer in stack.layers] == [0, 1, 2]
    save_tiny(str(tmp_path), target, stack, cfg)
    t2, s2, c2 = load_tiny(str(tmp_path))
    assert c2.num_nextn_predict_layers == 3 and isinstance(s2, MTPStack)
    for a, b in zip(stack.state_dict().values(), s2.state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="layer"):
        s2(None, paddle.zeros([0, 32]), None, layer=3)
    assert isinstance(build_mtp(ModelConfig(), TinyTargetModel(ModelConfig())), MTPLayer)


def test_config_refuses_negative_layers():
    # 0 is a target without MTP layers; fewer is nonsense
    ModelConfig(num_nextn_predict_layers=0)
    with pytest.raises(ValueError, match="num_nextn_predict_layers"):
        ModelConfig(num_nextn_predict_layers=-1)
