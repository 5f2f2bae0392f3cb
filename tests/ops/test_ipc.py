"""set_data_ipc / share_external_data / unset_data_ipc in one process (the cross-process
runs are in tests/runtime/test_ipc_processes.py). On CPU a segment can be attached in the
process that created it, so the sharing itself is checked here too."""

from __future__ import annotations

import os
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import fastdeploy_mtp.ops as ops  # noqa: E402
from fastdeploy_mtp import _kernels  # noqa: E402

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs POSIX shared memory at /dev/shm")
SHAREABLE = ("float32", "float16", "bfloat16", "int8", "uint8")


@pytest.fixture
def name():
    tag = f"fdmtpu{uuid.uuid4().hex[:8]}"
    yield tag
    left = [p.name for p in SHM.iterdir() if p.name.startswith(tag)]
    for n in left:
        (SHM / n).unlink(missing_ok=True)
    assert not left, f"/dev/shm leftovers: {left}"


def mapped(segment: str) -> int:
    """How many mappings of `segment` this process holds."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sum(1 for line in lines if line.removesuffix(" (deleted)").endswith("/dev/shm/" + segment))


def placeholder(dtype: str):
    return paddle.empty([], dtype=dtype)


@pytest.mark.parametrize("dtype", SHAREABLE)
def test_set_data_ipc_moves_the_storage_and_the_same_tensor_keeps_working(name, dtype):
    t = paddle.to_tensor(np.arange(24).reshape(4, 6) % 50, dtype=dtype)
    before = t.astype("float32").numpy()
    ptr = t.data_ptr()
    obj = id(t)
    ops.set_data_ipc(t, name)
    assert id(t) == obj and t.data_ptr() != ptr  # same object, new storage
    assert mapped(name) == 1
    np.testing.assert_array_equal(t.astype("float32").numpy(), before)  # contents kept
    assert os.path.getsize(SHM / name) == 4096 + t.numel().item() * t.element_size()
    a = ops.share_external_data(placeholder(dtype), name, [4, 6])
    assert a.dtype == t.dtype and a.shape == [4, 6] and a.data_ptr() != t.data_ptr()
    np.testing.assert_array_equal(a.astype("float32").numpy(), before)
    a[1, 2] = 7  # attacher -> creator
    t[3, 5] = 9  # creator -> attacher (set_value in place)
    assert t.astype("float32").numpy()[1, 2] == 7 and a.astype("float32").numpy()[3, 5] == 9
    ops.unset_data_ipc(t, name, False, True)
    assert not (SHM / name).exists()


def test_in_place_ops_on_the_creator_tensor_write_shared_memory(name):
    t = paddle.zeros([8], dtype="float32")
    ops.set_data_ipc(t, name)
    a = ops.share_external_data(placeholder("float32"), name, [8])
    paddle.assign(paddle.ones([8]), output=t)
    t.add_(paddle.ones([8]))
    np.testing.assert_array_equal(a.numpy(), np.full(8, 2, np.float32))
    ops.unset_data_ipc(a, name, True, True)


def test_attach_a_prefix_with_a_smaller_shape(name):
    t = paddle.to_tensor(np.arange(12, dtype=np.float32))
    ops.set_data_ipc(t, name)
    a = ops.share_external_data(placeholder("float32"), name, [2, 3])
    np.testing.assert_array_equal(a.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    ops.unset_data_ipc(t, name, False, True)


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "float64"])
def test_unsupported_dtype_is_rejected(name, dtype):
    with pytest.raises(
        ops.OpError,
        match=r"^set_data_ipc: `tmp_input` has dtype "
        r".*only float32, float16, bfloat16, int8 and uint8",
    ):
        ops.set_data_ipc(paddle.zeros([3], dtype=dtype), name)
    assert not (SHM / name).exists()


@pytest.mark.parametrize("bad", ["a/b", "/leading", ""])
def test_name_with_a_slash_or_empty_is_rejected(bad):
    with pytest.raises(ops.OpError, match="`shm_name`"):
        ops.set_data_ipc(paddle.zeros([3]), bad)
    with pytest.raises(ops.OpError, match="`shm_name`"):
        ops.share_external_data(placeholder("float32"), bad, [3])
    with pytest.raises(ops.OpError, match="`shm_name`"):
        ops.unset_data_ipc(paddle.zeros([3]), bad, False, True)


def test_attaching_a_name_that_does_not_exist(name):
    with pytest.raises(ops.OpError, match=f"no shared-memory segment named `{name}`"):
        ops.share_external_data(placeholder("float32"), name, [3])


def test_shape_larger_than_the_segment(name):
    t = paddle.zeros([4, 6], dtype="float16")
    ops.set_data_ipc(t, name)
    with pytest.raises(ops.OpError, match=r"`shape` \[5, 6\] needs 60 bytes but segment .* holds 48 bytes"):
        ops.share_external_data(placeholder("float16"), name, [5, 6])
    with pytest.raises(ops.OpError, match="negative dimension"):
        ops.share_external_data(placeholder("float16"), name, [-1])
    ops.unset_data_ipc(t, name, False, True)


def test_dtype_mismatch(name):
    t = paddle.zeros([4], dtype="bfloat16")
    ops.set_data_ipc(t, name)
    with pytest.raises(ops.OpError, match="dtype mismatch: `input` is float16 but segment .* holds a bfloat16 tensor"):
        ops.share_external_data(placeholder("float16"), name, [4])
    ops.unset_data_ipc(t, name, False, True)


def test_a_segment_not_written_by_set_data_ipc_is_rejected(name):
    raw = shared_memory.SharedMemory(name=name, create=True, size=200)
    try:
        with pytest.raises(ops.OpError, match="not a complete tensor segment"):
            ops.share_external_data(placeholder("float32"), name, [1])
    finally:
        raw.close()
        raw.unlink()


def test_unset_unlinks_and_a_missing_name_is_fine(name):
    t = paddle.zeros([4])
    ops.set_data_ipc(t, name)
    ops.unset_data_ipc(t, name, False, True)
    assert not (SHM / name).exists()
    ops.unset_data_ipc(t, name, False, True)  # ENOENT counts as success, as upstream
    np.testing.assert_array_equal(t.numpy(), np.zeros(4, np.float32))  # creator keeps its tensor


def test_set_data_ipc_replaces_a_stale_segment(name):
    old = paddle.full([4], 1.0)
    ops.set_data_ipc(old, name)
    new = paddle.full([4], 2.0)
    ops.set_data_ipc(new, name)
    a = ops.share_external_data(placeholder("float32"), name, [4])
    np.testing.assert_array_equal(a.numpy(), np.full(4, 2, np.float32))
    np.testing.assert_array_equal(old.numpy(), np.full(4, 1, np.float32))  # still mapped, now private
    ops.unset_data_ipc(new, name, False, True)


def test_close_ipc_releases_the_attachment_and_later_use_is_an_error(name):
    t = paddle.ones([4])
    ops.set_data_ipc(t, name)
    a = ops.share_external_data(placeholder("float32"), name, [4])
    assert mapped(name) == 2
    ops.unset_data_ipc(a, name, True, False)
    assert mapped(name) == 1  # the attacher's mapping is gone, the creator's stays
    assert not a._is_initialized()
    with pytest.raises(RuntimeError, match="holds no memory"):
        a.sum()
    ops.unset_data_ipc(t, name, True, True)
    assert mapped(name) == 0


def test_attached_tensor_outlives_the_name_and_the_creator_tensor(name):
    t = paddle.to_tensor(np.arange(5, dtype=np.float32))
    ops.set_data_ipc(t, name)
    a = ops.share_external_data(placeholder("float32"), name, [5])
    ops.unset_data_ipc(t, name, False, True)
    del t
    np.testing.assert_array_equal(a.numpy(), np.arange(5, dtype=np.float32))
    assert mapped(name) == 1
    del a
    assert mapped(name) == 0


def test_a_view_keeps_the_mapping_alive_after_close(name):
    t = paddle.to_tensor(np.arange(6, dtype=np.float32))
    ops.set_data_ipc(t, name)
    a = ops.share_external_data(placeholder("float32"), name, [6])
    view = a.reshape([2, 3])  # shares a's storage
    ops.unset_data_ipc(a, name, True, True)
    np.testing.assert_array_equal(view.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    del view, t
    assert mapped(name) == 0


def test_repeated_attach_detach_cycles_do_not_leak(name):
    t = paddle.zeros([64, 64], dtype="bfloat16")
    ops.set_data_ipc(t, name)
    fds = len(os.listdir("/proc/self/fd"))
    for i in range(100):
        a = ops.share_external_data(placeholder("bfloat16"), name, [64, 64])
        a[0, 0] = float(i)
        ops.unset_data_ipc(a, name, True, False)
        del a
    assert mapped(name) == 1  # only the creator's
    assert len(os.listdir("/proc/self/fd")) == fds  # every segment fd was closed
    assert t.astype("float32").numpy()[0, 0] == 99
    ops.unset_data_ipc(t, name, True, True)
    assert mapped(name) == 0


def test_kernels_module_shares_numpy_memory(name):
    src = np.arange(10, dtype=np.float32)
    shared = _kernels.set_data_ipc(src, name)  # a numpy array cannot be re-homed: a copy
    assert shared.shape == (10,) and shared.dtype == "float32" and shared.device == "cpu"
    mine = np.from_dlpack(shared)
    att = _kernels.share_external_data(np.empty((), np.float32), name, [2, 5])
    theirs = np.from_dlpack(att)
    theirs[1, 4] = -1.0
    assert mine[9] == -1.0 and src[9] == 9.0
    with pytest.raises(ValueError, match="share_external_data: dtype mismatch"):
        _kernels.share_external_data(np.empty((), np.int8), name, [1])
    _kernels.unset_data_ipc(att, name, True, True)
    assert att.closed and theirs[1, 4] == -1.0  # the DLPack view keeps the mapping
    with pytest.raises(ValueError, match="closed"):
        np.from_dlpack(att)
    del shared, mine, theirs, att
    assert mapped(name) == 0


def test_host_segment_with_a_cuda_placeholder_is_rejected(name):
    _kernels.set_data_ipc(np.zeros(4, np.float32), name)
    with pytest.raises(ValueError, match="holds host memory but `input` is on cuda|no CUDA support"):
        _kernels.share_external_data((0, "float32", (), "cuda:0"), name, [4])
    _kernels.unset_data_ipc(None, name, False, True)


def test_use_ipc_false_applies_to_xpu_tensors_only(name):
    t = paddle.ones([4])
    ops.set_data_ipc(t, name)
    with pytest.raises(
        ops.OpError, match=r"`use_ipc`=False reuses the creator's XPU device pointer and applies to XPU"
    ):
        ops.share_external_data(placeholder("float32"), name, [4], use_ipc=False)
    a = ops.share_external_data(placeholder("float32"), name, [4], use_ipc=True)  # upstream's XPU call form
    np.testing.assert_array_equal(a.numpy(), np.ones(4, np.float32))
    ops.unset_data_ipc(t, name, False, True)
