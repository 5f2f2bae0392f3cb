"""The per-slot states of linear-attention layers (:mod:`fastdeploy_mtp.models.linear_state`):
the commit picks, for each verified slot, the snapshot after its accepted tokens and leaves
every other slot alone; the state tensors of each linear layer, split over the ranks; a
model without linear layers gets none."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.capacity import Capacity, blocks_per_request, plan_capacity
from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.engine_args import build_config
from fastdeploy_mtp.models import load_tiny
from fastdeploy_mtp.models.hybrid_config import HybridSpec
from fastdeploy_mtp.models.linear_state import (
    STATE_KINDS,
    LinearStates,
    model_state_specs,
    state_specs,
)
from fastdeploy_mtp.models.model_config import has_linear_attention


def _states(config: SimpleNamespace, slots: int, rows: int) -> LinearStates:
    specs = state_specs(config, slots, rows)
    return LinearStates.from_tensors(specs, [paddle.zeros(list(s.shape)) for s in specs])


def test_commit_takes_the_snapshot_after_the_accepted_tokens() -> None:
    states = _states(_hybrid(("linear_attention",) * 2), 4, 4)
    rng = np.random.default_rng(0)
    for group in (states.conv, states.recurrent, states.conv_snapshots, states.recurrent_snapshots):
        for t in group:
            values = rng.standard_normal(t.shape).astype("float32")
            paddle.assign(paddle.to_tensor(values), output=t)
    before = [t.numpy().copy() for t in states.conv + states.recurrent]
    snaps = [t.numpy().copy() for t in states.conv_snapshots + states.recurrent_snapshots]
    accept = paddle.to_tensor([1, 3, 4, 2], dtype="int32")
    verified = paddle.to_tensor([True, True, True, False])
    states.commit(accept, verified)
    for got, old, snap in zip(states.conv + states.recurrent, before, snaps):
        got = got.numpy()
        for slot, a in enumerate([1, 3, 4]):
            np.testing.assert_array_equal(got[slot], snap[slot, a - 1])
        np.testing.assert_array_equal(got[3], old[3])  # not verified: untouched


def _hybrid(layer_types: tuple[str, ...]) -> SimpleNamespace:
    """A config whose ``hybrid`` layout has the given layers (4 value heads over 2 key heads of
    width 8 and 4, a kernel of 4)."""
    spec = HybridSpec(
        layer_types=layer_types,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=4,
        linear_conv_kernel_dim=4,
        fused_projections=True,
    )
    return SimpleNamespace(hybrid=spec)


def test_state_bytes_per_slot_count_every_layer_and_snapshot() -> None:
    specs = state_specs(_hybrid(("linear_attention", "full_attention") * 3), 2, 4)
    conv, recurrent = 48 * 3, 4 * 8 * 4  # (2 * 2 * 8 + 4 * 4) channels x 3; 4 x 8 x 4
    per_layer = (conv + recurrent) * (1 + 4) * 4  # state and 4 snapshot rows, float32
    assert sum(s.nbytes for s in specs) == 2 * 3 * per_layer
    assert _states(_hybrid(("linear_attention",)), 2, 4).max_rows == 4


def test_state_specs_cover_each_linear_layer_split_over_the_ranks() -> None:
    config = _hybrid(("linear_attention", "full_attention") * 2)
    specs = state_specs(config, 3, 4, tensor_parallel_size=2)
    assert [(s.layer, s.kind) for s in specs] == [
        (layer, kind) for layer in range(2) for kind in STATE_KINDS
    ]
    shapes = {s.kind: s.shape for s in specs}
    assert shapes == {
        "conv_state": (3, 24, 3),
        "recurrent_state": (3, 2, 8, 4),
        "conv_snapshots": (3, 4, 24, 3),
        "recurrent_snapshots": (3, 4, 2, 8, 4),
    }
    states = LinearStates.from_tensors(specs, [paddle.zeros(list(s.shape)) for s in specs])
    assert [list(t.shape) for t in states.tensors()] == [list(s.shape) for s in specs]


def test_models_without_linear_layers_get_no_states() -> None:
    target, _, arch = load_tiny()
    assert not has_linear_attention(arch)
    cfg = build_config(arch, SpeculativeConfig.from_dict({"method": "mtp"}), 3, 256)
    assert model_state_specs(target, cfg) == [] and state_specs(arch, 3, 4) == []


def test_capacity_takes_the_slots_states_from_the_kv_budget() -> None:
    def plan(max_num_seqs: int | None, memory: int, slot_bytes: int = 0) -> Capacity:
        return plan_capacity(
            block_size=16,
            block_bytes=1000,
            max_model_len=256,  # 16 blocks + the lookahead's
            k=3,
            max_num_seqs=max_num_seqs,
            slot_cap=256,
            kv_memory=memory,
            tp=1,
            max_num_batched_tokens=None,
            slot_bytes=slot_bytes,
        )

    full = plan(1, 10**9).total_block_num  # one request's worst case
    assert plan(4, 4 * full * 1000).total_block_num == 4 * full
    # the states of 4 slots leave room for fewer blocks
    states = plan(4, 4 * full * 1000, slot_bytes=2 * 1000)
    assert states.total_block_num == 4 * full - 8
    # a typical request (a quarter of max_model_len) plus its states decide the default slots
    typical = plan(None, 10**9).total_block_num  # (capped by 256 slots of full requests)
    assert typical == 256 * full
    per_slot = blocks_per_request(64, 16) * 1000 + 12_000  # its blocks, then its states
    assert plan(None, 20 * per_slot, slot_bytes=12_000).max_num_seqs == 20
    with pytest.raises(ValueError, match="after 4 slots' states of 20000 bytes"):
        plan(4, 4 * 20_000 + (full - 1) * 1000, slot_bytes=20_000)
