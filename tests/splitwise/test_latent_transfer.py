"""A multi-head latent attention deployment's prefill/decode hand-over, in process: every
latent cache (one per target layer and per MTP layer, the same on every tensor-parallel rank's
spec) moves over tcp and shm, and a decode instance whose cache spec differs is refused."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.ipc.kv_caches import publish_caches, spec_cache_names, unpublish_caches
from fastdeploy_mtp.models import ModelConfig
from fastdeploy_mtp.models.cache_spec import describe, model_cache_specs
from fastdeploy_mtp.splitwise.kv_client import pull_blocks
from fastdeploy_mtp.splitwise.kv_layout import KVLayout, TransferError
from fastdeploy_mtp.splitwise.kv_source import KVSource

SRC_BLOCKS, DST_BLOCKS, TP = 9, 11, 2


def mla_config(**overrides: Any) -> ModelConfig:
    """DeepSeek-V3-shaped: 2 layers, 2 MTP layers, kv_lora_rank 32 + rope 8 = 40 per token."""
    fields: dict[str, Any] = dict(
        vocab_size=64, ori_vocab_size=64, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, intermediate_size=96, attention_type="mla",
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        block_size=4, num_nextn_predict_layers=2,
    )  # fmt: skip
    return ModelConfig(**{**fields, **overrides})


def spec_caches(
    config: ModelConfig, num_blocks: int, seed: int | None
) -> tuple[list[list[np.ndarray]], Any]:
    """Per rank, one array per cache of the deployment's spec (random or zeros), and its
    description."""
    specs = model_cache_specs(config, num_blocks, TP)
    rng = np.random.default_rng(seed)
    make = (lambda s: np.zeros(s.shape, np.float32)) if seed is None else (
        lambda s: rng.standard_normal(s.shape).astype(np.float32)
    )  # fmt: skip
    return [[make(s) for s in specs] for _ in range(TP)], describe(specs)


class Released:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, request_id: str, reason: str) -> None:
        with self._lock:
            self.calls.append((request_id, reason))

    def wait(self) -> list[tuple[str, str]]:
        deadline = time.monotonic() + 5.0
        while not self.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        return list(self.calls)


def test_mla_spec_is_one_latent_cache_per_layer() -> None:
    specs = model_cache_specs(mla_config(), SRC_BLOCKS, TP)
    assert [(s.owner, s.layer, s.kind) for s in specs] == [
        ("target", 0, "latent"), ("target", 1, "latent"),
        ("mtp", 0, "latent"), ("mtp", 1, "latent"),
    ]  # fmt: skip
    assert {s.shape for s in specs} == {(SRC_BLOCKS, 1, 4, 40)}  # not split by head under TP
    names = spec_cache_names(specs, 1, 7)
    assert names == [f"latent_caches_{n}_rank1.device7" for n in range(4)]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_every_latent_cache_of_target_and_mtp_moves(transport: str) -> None:
    config = mla_config()
    data, desc = spec_caches(config, SRC_BLOCKS, seed=3)
    specs = model_cache_specs(config, SRC_BLOCKS, TP)
    device_id = os.getpid() * 1000 + (1 if transport == "tcp" else 2)
    names = [spec_cache_names(specs, r, device_id) for r in range(TP)]
    tensors = [[paddle.to_tensor(a) for a in rank] for rank in data]
    released = Released()
    source = None
    try:
        for rank_tensors, rank_names in zip(tensors, names):
            publish_caches(rank_tensors, rank_names)
        src = [[np.from_dlpack(t) for t in rank] for rank in tensors]
        options = {"shm_names": names} if transport == "shm" else {}
        source = KVSource(src, KVLayout.of_caches(src, desc), released, **options)
        descriptor = json.loads(json.dumps(source.offer("mla", [5, 0, 7])))
        assert [c["kind"] for c in descriptor["layout"]["caches"]] == ["latent"] * 4
        dst, dst_desc = spec_caches(config, DST_BLOCKS, seed=None)
        layout = KVLayout.of_caches(dst, dst_desc)
        copied = pull_blocks(descriptor, dst, layout, [2, 10, 4], transport=transport)
        assert copied == TP * 3 * layout.block_nbytes == TP * 3 * 4 * (4 * 40 * 4)
        for r in range(TP):
            for c, entry in enumerate(layout.caches):
                np.testing.assert_array_equal(
                    dst[r][c][[2, 10, 4]], src[r][c][[5, 0, 7]], err_msg=entry.label
                )
                assert not dst[r][c][[b for b in range(DST_BLOCKS) if b not in (2, 10, 4)]].any()
        assert released.wait() == [("mla", "released")]
    finally:
        if source is not None:
            source.close()
        for rank_tensors, rank_names in zip(tensors, names):
            unpublish_caches(rank_tensors, rank_names)
    assert not any(os.path.exists(f"/dev/shm/{n}") for rank in names for n in rank)


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        (
            dict(kv_lora_rank=16),
            r"cache 0 \(target layer 0 latent\): block shape \[1, 4, 40\] on the prefill",
        ),
        (
            dict(attention_type="gqa", head_dim=16),
            r"cache 0 \(target layer 0 latent\): prefill has target layer 0 latent, "
            r"this decode .* layer 0 key",
        ),
        (
            dict(num_nextn_predict_layers=1),
            r"prefill has 4 caches per rank, this decode instance 3",
        ),
    ],
)
def test_a_decode_instance_with_another_cache_spec_is_refused(
    decode: dict[str, Any], message: str
) -> None:
    config = mla_config()
    data, desc = spec_caches(config, SRC_BLOCKS, seed=5)
    released = Released()
    source = KVSource(data, KVLayout.of_caches(data, desc), released)
    try:
        descriptor = source.offer("bad", [1])
        dst, dst_desc = spec_caches(mla_config(**decode), DST_BLOCKS, seed=None)
        with pytest.raises(TransferError, match=f"KV layout mismatch.*{message}"):
            pull_blocks(descriptor, dst, KVLayout.of_caches(dst, dst_desc), [0])
        assert not any(a.any() for rank in dst for a in rank)
    finally:
        source.close()
