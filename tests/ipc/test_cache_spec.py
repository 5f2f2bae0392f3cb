"""The model's cache spec (every KV cache of a deployment) and the IPC names derived from it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastdeploy_mtp.ipc.kv_caches import spec_cache_names
from fastdeploy_mtp.models.cache_spec import (
    CacheSpec,
    describe,
    key_value_specs,
    model_cache_specs,
    owned_by,
)
from fastdeploy_mtp.splitwise.kv_layout import KVLayout, TransferError
from tests.support.engines import tiny_arch as arch


@pytest.mark.parametrize("mtp_layers", [0, 1, 3])
def test_one_key_and_one_value_cache_per_target_and_mtp_layer_in_order(mtp_layers: int) -> None:
    specs = model_cache_specs(arch(num_nextn_predict_layers=mtp_layers), 9, 1, with_mtp=True)
    assert len(owned_by(specs, "target")) == 4 and len(owned_by(specs, "mtp")) == 2 * mtp_layers
    expected = [("target", n, kind) for n in range(2) for kind in ("key", "value")]
    expected += [("mtp", n, kind) for n in range(mtp_layers) for kind in ("key", "value")]
    assert [(s.owner, s.layer, s.kind) for s in specs] == expected
    assert {s.shape for s in specs} == {(9, 2, 8, 8)} and {s.dtype for s in specs} == {"float32"}
    # speculation off: no MTP caches, whatever the checkpoint carries
    assert (
        model_cache_specs(arch(num_nextn_predict_layers=mtp_layers), 9, 1, with_mtp=False)
        == specs[:4]
    )


def test_tensor_parallel_ranks_hold_their_share_of_the_kv_heads() -> None:
    specs = model_cache_specs(arch(num_nextn_predict_layers=3), 5, 2, with_mtp=True)
    assert len(specs) == 10 and {s.shape for s in specs} == {(5, 1, 8, 8)}
    with pytest.raises(
        ValueError, match="`num_key_value_heads` \\(2\\) is not divisible by `tensor_parallel_size`"
    ):
        model_cache_specs(arch(hidden_size=48, num_attention_heads=6), 5, 3, with_mtp=True)
    with pytest.raises(ValueError, match="`num_blocks` must be positive"):
        model_cache_specs(arch(), 0, 1, with_mtp=True)


@pytest.mark.parametrize(("dtype", "itemsize"), [("float32", 4), ("bfloat16", 2), ("float16", 2)])
def test_the_caches_have_the_models_dtype(dtype: str, itemsize: int) -> None:
    specs = model_cache_specs(arch(dtype=dtype), 3, 1, with_mtp=True)
    assert {s.dtype for s in specs} == {dtype}
    assert specs[0].nbytes == 3 * 2 * 8 * 8 * itemsize
    assert specs[0].block_shape == (2, 8, 8) and specs[0].num_blocks == 3


def test_description_round_trips_through_json_and_refuses_bad_entries() -> None:
    """The splitwise layout reads back what :func:`describe` writes."""
    specs = model_cache_specs(arch(num_nextn_predict_layers=3), 4, 2, with_mtp=True)
    text = json.dumps(describe(specs))
    layout = KVLayout.from_description(2, json.loads(text))
    assert [c.to_dict() for c in layout.caches] == [s.to_dict() for s in specs]
    assert json.loads(text)[4] == {
        "owner": "mtp",
        "layer": 0,
        "kind": "key",
        "shape": [4, 1, 8, 8],
        "dtype": "float32",
    }
    # a latent cache (one per layer, its own shape) is one more entry of the same form
    latent = CacheSpec("target", 0, "latent", (4, 8, 96), "bfloat16")
    (entry,) = KVLayout.from_description(1, describe([latent])).caches
    assert entry.to_dict() == latent.to_dict() and entry.block_nbytes == 8 * 96 * 2
    bad = json.loads(text)
    bad[2]["kind"] = "query"
    with pytest.raises(TransferError, match=r"`caches\[2\]`: `kind` must be 'key', 'value'"):
        KVLayout.from_description(2, bad)
    bad = json.loads(text)
    del bad[5]["dtype"]
    with pytest.raises(TransferError, match=r"`caches\[5\]` must have the keys"):
        KVLayout.from_description(2, bad)
    for entry_override, key in (
        ({"shape": [4, 0, 8, 8]}, "shape"),
        ({"layer": -1}, "layer"),
        ({"dtype": "int8"}, "dtype"),
    ):
        with pytest.raises(TransferError, match=f"`{key}`"):
            KVLayout.from_description(1, [{**specs[0].to_dict(), **entry_override}])
    with pytest.raises(TransferError, match="non-empty list"):
        KVLayout.from_description(1, [])


def test_names_are_fastdeploys_with_the_mtp_layers_after_the_target_layers() -> None:
    specs = model_cache_specs(arch(num_nextn_predict_layers=3), 4, 2, with_mtp=True)
    names = spec_cache_names(specs, 1, 7)
    assert names[:4] == [
        "key_caches_0_rank1.device7",
        "value_caches_0_rank1.device7",
        "key_caches_1_rank1.device7",
        "value_caches_1_rank1.device7",
    ]
    assert names[4:] == [
        f"{kind}_caches_{n}_rank1.device7" for n in (2, 3, 4) for kind in ("key", "value")
    ]
    # the proposer names its own part with the target's layer count given
    assert spec_cache_names(owned_by(specs, "mtp"), 1, 7, num_target_layers=2) == names[4:]
    mtp_only = key_value_specs("mtp", 1, (4, 1, 8, 8), "float32")
    assert spec_cache_names(mtp_only, 0, 0, num_target_layers=5) == [
        "key_caches_5_rank0.device0",
        "value_caches_5_rank0.device0",
    ]


def test_bfloat16_caches_published_and_attached_by_spec_share_memory_with_int16_host_views() -> (
    None
):
    """A bfloat16 cache attached with its spec's shape and dtype maps the creator's memory; its
    host view (what the KV transfer copies) is int16, the bits."""
    import os

    import paddle

    from fastdeploy_mtp.ipc.kv_caches import (
        attach_spec_caches,
        detach_caches,
        host_view,
        publish_caches,
        unpublish_caches,
    )

    specs = model_cache_specs(
        arch(dtype="bfloat16", num_nextn_predict_layers=2), 3, 1, with_mtp=True
    )
    names = spec_cache_names(specs, 0, os.getpid() * 10 + 7)
    created = [paddle.zeros(list(s.shape), dtype=s.dtype) for s in specs]
    publish_caches(created, names)
    try:
        attached = attach_spec_caches(specs, names)
        try:
            view = host_view(attached[-1])  # the last MTP layer's value cache
            assert view.dtype == np.int16 and view.shape == specs[-1].shape and view.flags.writeable
            view[1, 0, 0, 0] = np.array([1.5], np.float32).view(np.int32)[0] >> 16  # bfloat16 1.5
            assert float(created[-1][1, 0, 0, 0].astype("float32")) == 1.5
            assert attached[0].dtype == paddle.bfloat16 and list(attached[0].shape) == list(
                specs[0].shape
            )
        finally:
            detach_caches(attached, names)
    finally:
        unpublish_caches(created, names)
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)
