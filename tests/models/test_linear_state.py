"""The per-slot states of linear-attention layers (:mod:`fastdeploy_mtp.models.linear_state`):
the commit picks, for each verified slot, the snapshot after its accepted tokens and leaves
every other slot alone; a model without linear layers gets no states; prefix caching is
refused for one that has them."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.engine_args import build_config
from fastdeploy_mtp.models import load_tiny
from fastdeploy_mtp.models.linear_state import LinearStates, linear_states_for
from fastdeploy_mtp.models.model_config import has_linear_attention


def test_commit_takes_the_snapshot_after_the_accepted_tokens() -> None:
    states = LinearStates.zeros(2, 4, 4, (3, 2), (2, 2, 2))
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


def test_state_bytes_per_slot_count_every_layer_and_snapshot() -> None:
    states = LinearStates.zeros(3, 2, 4, (5, 3), (2, 4, 4))
    per_layer = (5 * 3 + 2 * 4 * 4) * (1 + 4) * 4
    assert states.nbytes_per_slot() == 3 * per_layer
    assert states.max_rows == 4


class _Hybrid:
    """A stand-in for a model with two linear-attention layers."""

    def linear_state_shapes(self) -> tuple[int, tuple[int, int], tuple[int, int, int]]:
        return 2, (6, 3), (2, 4, 4)


def test_states_are_made_for_hybrid_models_only_and_refuse_prefix_caching() -> None:
    target, _, arch = load_tiny()
    assert not has_linear_attention(arch)
    cfg = build_config(arch, SpeculativeConfig.from_dict({"method": "mtp"}), 3, 256)
    assert linear_states_for(target, cfg) is None
    cfg.cache_config.enable_prefix_caching = False
    states = linear_states_for(_Hybrid(), cfg)
    assert states is not None
    k = cfg.speculative_config.num_speculative_tokens
    assert list(states.recurrent_snapshots[1].shape) == [3, k + 1, 2, 4, 4]
    assert list(states.conv[0].shape) == [3, 6, 3]
    cfg.cache_config.enable_prefix_caching = True
    with pytest.raises(ValueError, match="enable_prefix_caching: the model has linear-attention"):
        linear_states_for(_Hybrid(), cfg)
