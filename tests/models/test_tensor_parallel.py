"""Tensor parallelism of the tiny model: sharded layers against the unsharded math in a real
2-process gloo group, load-time slicing of the checkpoint, the shapes and the errors."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from fastdeploy_mtp import distributed
from fastdeploy_mtp.models import (
    ASSETS_DIR,
    ColumnParallelLinear,
    ModelConfig,
    ParallelLMHead,
    RowParallelLinear,
    TensorSource,
    VocabParallelEmbedding,
    causal_bias,
    config_for_family,
    kv_cache_shape,
    load_mtp_weights,
    load_tiny,
    shard_axes,
)
from fastdeploy_mtp.models.tiny import WEIGHTS_FILE
from tests.support.tp import run_ranks

ROW_TOL = 1e-5  # row-parallel sums in another order: float32 rounding only


@pytest.fixture(scope="module")
def layer_results():
    return run_ranks("layers", 2, timeout=90)


@pytest.mark.parametrize("name", ["column", "embedding", "lm_head"])
def test_column_embedding_and_head_shards_are_exact(layer_results, name):
    for rank in layer_results:
        assert rank[name]["shape_ok"], rank[name]
        assert rank[name]["bit_identical"], rank[name]


@pytest.mark.parametrize("name", ["row", "decoder_layer"])
def test_row_parallel_and_decoder_layer_match_unsharded_within_rounding(layer_results, name):
    for rank in layer_results:
        assert rank[name]["shape_ok"], rank[name]
        assert rank[name]["max_abs_diff"] <= ROW_TOL, rank[name]


@pytest.mark.parametrize("name", ["row", "embedding", "lm_head", "decoder_layer"])
def test_ranks_get_identical_replicated_outputs(layer_results, name):
    assert layer_results[0][name]["sha1"] == layer_results[1][name]["sha1"]


def test_empty_inputs_skip_the_collectives_on_every_rank(layer_results):
    for rank in layer_results:
        assert rank["empty_shapes"] == [[0, 16], [0, 12], [0, 6], [0]]
        assert rank["after_empty"] == [5]  # rank 0's value, so the group survived


def test_tp1_load_is_the_full_checkpoint_bit_for_bit():
    src = TensorSource(f"{ASSETS_DIR}/{WEIGHTS_FILE}")
    for kwargs in ({}, {"tensor_parallel_size": 1, "tensor_parallel_rank": 0}):
        target, mtp, config = load_tiny(**kwargs)
        assert target.attn_backend.num_kv_heads == config.num_key_value_heads
        for prefix, layer in (("", target), ("mtp.", mtp)):
            for name, param in layer.named_parameters():
                np.testing.assert_array_equal(
                    param.numpy(), src.get(prefix + name), err_msg=prefix + name
                )


def test_tp1_parallel_layers_compute_the_plain_ops_bit_for_bit():
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal([6, 8]).astype(np.float32))
    ids = paddle.to_tensor(np.array([0, 5, 11, 3], np.int64))
    col, row, head = (
        ColumnParallelLinear(8, 10, 1, bias_attr=None),
        RowParallelLinear(8, 7),
        ParallelLMHead(8, 12),
    )
    emb = VocabParallelEmbedding(12, 8)
    np.testing.assert_array_equal(col(x).numpy(), F.linear(x, col.weight, col.bias).numpy())
    np.testing.assert_array_equal(row(x).numpy(), F.linear(x, row.weight).numpy())
    np.testing.assert_array_equal(head(x).numpy(), F.linear(x, head.weight).numpy())
    np.testing.assert_array_equal(emb(ids).numpy(), F.embedding(ids, emb.weight).numpy())


def test_tp2_shard_holds_its_slice_of_every_sharded_tensor():
    src = TensorSource(f"{ASSETS_DIR}/{WEIGHTS_FILE}")
    target, mtp, config = load_tiny(
        tensor_parallel_size=2, tensor_parallel_rank=1
    )  # no collective yet
    axes = shard_axes(target)
    assert axes["embed_tokens.weight"] == 0 and axes["lm_head.weight"] == 1
    assert (
        axes["layers.0.self_attn.q_proj.weight"] == 1
        and axes["layers.0.self_attn.o_proj.weight"] == 0
    )
    assert axes["layers.1.mlp.up_proj.weight"] == 1 and axes["layers.1.mlp.down_proj.weight"] == 0
    assert "norm.weight" not in axes and "mtp_block.input_layernorm.weight" not in shard_axes(mtp)
    assert "eh_proj.weight" not in shard_axes(mtp)  # replicated
    assert shard_axes(mtp)["mtp_block.self_attn.k_proj.weight"] == 1
    for prefix, layer in (("", target), ("mtp.", mtp)):
        layer_axes = shard_axes(layer)
        for name, param in layer.named_parameters():
            full = src.get(prefix + name)
            axis = layer_axes.get(name)
            want = full if axis is None else np.split(full, 2, axis=axis)[1]
            np.testing.assert_array_equal(param.numpy(), want, err_msg=prefix + name)
    hd = config.head_dim
    assert list(target.layers[0].self_attn.q_proj.weight.shape) == [config.hidden_size, 2 * hd]
    assert list(target.layers[0].self_attn.k_proj.weight.shape) == [config.hidden_size, 1 * hd]
    assert target.attn_backend.get_kv_cache_shape(5) == [5, 1, config.block_size, hd]
    assert mtp.attn_backend.get_kv_cache_shape(5) == [5, 1, config.block_size, hd]


def test_kv_cache_shape_matches_each_ranks_backend():
    _, _, config = load_tiny()
    assert kv_cache_shape(config, 9, 1) == [
        9,
        config.num_key_value_heads,
        config.block_size,
        config.head_dim,
    ]
    assert kv_cache_shape(config, 9, 2) == [
        9,
        config.num_key_value_heads // 2,
        config.block_size,
        config.head_dim,
    ]
    for rank in (0, 1):
        target, mtp, _ = load_tiny(tensor_parallel_size=2, tensor_parallel_rank=rank)
        assert target.attn_backend.get_kv_cache_shape(9) == kv_cache_shape(config, 9, 2)
        assert mtp.attn_backend.get_kv_cache_shape(9) == kv_cache_shape(config, 9, 2)
    with pytest.raises(ValueError, match="num_blocks"):
        kv_cache_shape(config, 0, 2)


@pytest.mark.parametrize(
    ("overrides", "tp", "field"),
    [
        ({"num_attention_heads": 8, "num_key_value_heads": 2}, 4, "num_key_value_heads"),
        (
            {"num_attention_heads": 6, "num_key_value_heads": 6, "hidden_size": 96},
            4,
            "num_attention_heads",
        ),
        ({"intermediate_size": 90}, 4, "intermediate_size"),
        ({"vocab_size": 270}, 4, "vocab_size"),
    ],
)
def test_non_divisible_layouts_are_rejected_naming_the_field(overrides, tp, field):
    base = {
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 96,
        "vocab_size": 272,
    }
    config = ModelConfig(**{**base, **overrides})
    with pytest.raises(
        ValueError, match=rf"`{field}` \(\d+\) is not divisible by `tensor_parallel_size` \({tp}\)"
    ):
        kv_cache_shape(config, 4, tp)
    from fastdeploy_mtp.models import TinyTargetModel

    with pytest.raises(ValueError, match=f"`{field}`"):
        TinyTargetModel(config, tp, 0)


def test_shipped_checkpoint_rejects_tp4_kv_heads_and_bad_ranks():
    with pytest.raises(ValueError, match="`num_key_value_heads` \\(2\\) is not divisible"):
        load_tiny(tensor_parallel_size=4, tensor_parallel_rank=0)
    with pytest.raises(ValueError, match="tensor_parallel_rank"):
        load_tiny(tensor_parallel_size=2, tensor_parallel_rank=2)


def test_training_path_and_family_loader_refuse_shards():
    target, mtp, config = load_tiny(tensor_parallel_size=2, tensor_parallel_rank=0)
    ids = paddle.to_tensor(np.zeros([1, 4], np.int64))
    with pytest.raises(NotImplementedError, match="tensor_parallel_size=2"):
        target.forward_dense(ids, causal_bias(4))
    with pytest.raises(NotImplementedError, match="tensor_parallel_size=2"):
        mtp.forward_dense(ids, paddle.zeros([1, 4, config.hidden_size]), causal_bias(4))
    assert config_for_family("ernie4_5", config).mtp_final_norm == mtp.config.mtp_final_norm
    with pytest.raises(ValueError, match="tensor-parallel shard"):
        load_mtp_weights(mtp, {}, "ernie4_5")


def test_tp1_training_path_still_runs():
    target, mtp, config = load_tiny()
    ids = paddle.to_tensor(np.arange(8, dtype=np.int64).reshape(1, 8))
    pre, post = target.forward_dense(ids, causal_bias(8))
    out = mtp.forward_dense(ids[:, 1:], post[:, :-1], causal_bias(7))
    assert list(out.shape) == [1, 7, config.hidden_size]


# ---- init_tensor_parallel ---------------------------------------------------------------------


def test_world_size_one_is_a_no_op_and_arguments_are_checked():
    distributed.init_tensor_parallel(0, 1, master_port=1)
    assert (
        distributed.tensor_parallel_group() is None
        and distributed.tensor_parallel_world_size() == 1
    )
    with pytest.raises(ValueError, match="`rank`"):
        distributed.init_tensor_parallel(2, 2, master_port=30000)
    with pytest.raises(ValueError, match="`world_size`"):
        distributed.init_tensor_parallel(0, 0, master_port=30000)
    with pytest.raises(ValueError, match="`timeout`"):
        distributed.init_tensor_parallel(0, 2, master_port=30000, timeout=0)
    with pytest.raises(ValueError, match="`master_port`"):
        distributed.init_tensor_parallel(0, 2, master_port=65535)
    with pytest.raises(RuntimeError, match="init_tensor_parallel"):
        distributed.all_reduce_sum(paddle.ones([2]))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_missing_peer_times_out_instead_of_hanging(monkeypatch, rank):
    monkeypatch.delenv("PADDLE_TRAINER_ID", raising=False)
    port = distributed.find_free_port_range(3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not (show up|hear from rank 0)"):
        distributed.init_tensor_parallel(rank, 2, port, timeout=1.5)
    assert 1.4 <= time.monotonic() - t0 < 10
    import os

    assert "PADDLE_TRAINER_ID" not in os.environ  # nothing set up when the rendezvous failed
    assert distributed.tensor_parallel_group() is None


def test_rendezvous_ignores_a_stray_connection_and_rejects_a_foreign_world():
    port = distributed.find_free_port_range(1)
    errors: list[BaseException] = []

    def rank0() -> None:
        try:
            distributed._rendezvous(0, 2, "127.0.0.1", port, 10.0)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    th = threading.Thread(target=rank0)
    th.start()
    deadline = time.monotonic() + 5
    while True:  # a connection that closes before its hello is skipped
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as peer:
        peer.sendall(distributed._HELLO.pack(distributed._MAGIC, 1, 3))  # says world_size 3
    th.join(10)
    assert not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "world_size 3" in str(errors[0])
