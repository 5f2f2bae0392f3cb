"""set_data_ipc / share_external_data / unset_data_ipc in one process (the cross-process
runs are in tests/runtime/test_ipc_processes.py). On CPU a segment can be attached in the
process that created it, so the sharing itself is checked here too."""

from __future__ import annotations

import os
import stat
import struct
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
    return sum(
        1 for line in lines if line.removesuffix(" (deleted)").endswith("/dev/shm/" + segment)
    )


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
    with pytest.raises(
        ops.OpError, match=r"`shape` \[5, 6\] needs 60 bytes but segment .* holds 48 bytes"
    ):
        ops.share_external_data(placeholder("float16"), name, [5, 6])
    with pytest.raises(ops.OpError, match="negative dimension"):
        ops.share_external_data(placeholder("float16"), name, [-1])
    ops.unset_data_ipc(t, name, False, True)


def test_dtype_mismatch(name):
    t = paddle.zeros([4], dtype="bfloat16")
    ops.set_data_ipc(t, name)
    with pytest.raises(
        ops.OpError,
        match="dtype mismatch: `input` is float16 but segment .* holds a bfloat16 tensor",
    ):
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
    np.testing.assert_array_equal(
        old.numpy(), np.full(4, 1, np.float32)
    )  # still mapped, now private
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
    with pytest.raises(
        ValueError, match="holds host memory but `input` is on cuda|no CUDA support"
    ):
        _kernels.share_external_data((0, "float32", (), "cuda:0"), name, [4])
    _kernels.unset_data_ipc(None, name, False, True)


def test_use_ipc_false_applies_to_xpu_tensors_only(name):
    t = paddle.ones([4])
    ops.set_data_ipc(t, name)
    with pytest.raises(
        ops.OpError,
        match=r"`use_ipc`=False reuses the creator's XPU device pointer and applies to XPU",
    ):
        ops.share_external_data(placeholder("float32"), name, [4], use_ipc=False)
    a = ops.share_external_data(
        placeholder("float32"), name, [4], use_ipc=True
    )  # upstream's XPU call form
    np.testing.assert_array_equal(a.numpy(), np.ones(4, np.float32))
    ops.unset_data_ipc(t, name, False, True)


# ---- hardening: sizes, strides, ownership and descriptors (issue 13) -----------------------
#
# Segments are forged by writing /dev/shm/<name> directly with the descriptor layout of
# custom_ops/include/fdmtp/ipc_segment.h: upstream's 72-byte prefix (nprocesses, 64 handle
# bytes), then magic, version, kind, dtype, device_id, data_bytes, data_offset, creator_pid,
# data_ptr_addr (128 bytes in all).

HEADER = struct.Struct("<Q64sQIIiiQQqQ")
MAGIC = 0x4350494D54504446
FLOAT32 = 7  # fdmtp::DType::kFloat32


def forge(name: str, *, size: int = 4096 + 64, mode: int = 0o600, **fields) -> Path:
    """A host-data segment as set_data_ipc writes it (16 float32 at offset 4096), with
    `fields` overriding descriptor fields, created with `mode`."""
    f = dict(
        nproc=0,
        handle=b"",
        magic=MAGIC,
        version=1,
        kind=1,
        dtype=FLOAT32,
        device_id=0,
        data_bytes=64,
        data_offset=4096,
        creator_pid=os.getpid(),
        data_ptr_addr=0,
    )
    f.update(fields)
    raw = bytearray(max(size, HEADER.size))
    HEADER.pack_into(raw, 0, *f.values())
    del raw[size:]  # a short segment: the header cut off
    if size >= 4096 + 64:
        raw[4096 : 4096 + 64] = np.arange(16, dtype=np.float32).tobytes()
    path = SHM / name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.write(fd, bytes(raw))
    finally:
        os.close(fd)
    os.chmod(path, mode)  # not subject to the umask
    return path


def test_share_external_data_shape_whose_byte_size_wraps_is_refused(name):
    """[65536, 65536, 65536, 16384] float32 is 2^64 bytes: it used to wrap to 0 and attach a
    64-byte segment as that shape."""
    t = paddle.zeros([16])
    ops.set_data_ipc(t, name)
    for shape in ([65536, 65536, 65536, 16384], [2**31 - 1] * 3):
        with pytest.raises(
            ops.OpError, match=r"^share_external_data: `shape` \[.*\] has more than 2\^56 elements"
        ):
            ops.share_external_data(placeholder("float32"), name, shape)
        with pytest.raises(
            ValueError, match=r"^share_external_data: `shape` \[.*\] has more than 2\^56 elements"
        ):
            _kernels.share_external_data(np.empty((), np.float32), name, shape)
    with pytest.raises(
        ops.OpError, match=r"^share_external_data: `shape` .* dimension 4294967296 above 2\^31-1"
    ):
        ops.share_external_data(placeholder("float32"), name, [2**32])  # the Paddle attr is int32
    with pytest.raises(
        ValueError, match=r"^share_external_data: `shape` has a dimension outside int64"
    ):
        _kernels.share_external_data(np.empty((), np.float32), name, [2**70])
    with pytest.raises(
        ValueError, match=r"^share_external_data: `shape` \[4, -1\] has a negative dimension -1"
    ):
        _kernels.share_external_data(np.empty((), np.float32), name, [4, -1])
    with pytest.raises(
        ops.OpError, match=r"^share_external_data: `shape` \[-4\] has a negative dimension -4"
    ):
        ops.share_external_data(placeholder("float32"), name, [-4])
    with pytest.raises(ValueError, match=r"^share_external_data: `shape` must hold ints"):
        _kernels.share_external_data(np.empty((), np.float32), name, [4.0])
    a = ops.share_external_data(
        placeholder("float32"), name, [4, 4]
    )  # the exact size still attaches
    assert a.shape == [4, 4]
    ops.unset_data_ipc(t, name, False, True)


def test_set_data_ipc_refuses_a_strided_view(name):
    """A strided view used to be replaced by a contiguous copy, and the copy was published:
    creator and attachers never saw each other's writes."""
    big = paddle.arange(16, dtype="float32")
    for view in (big[::2], big.reshape([4, 4]).transpose([1, 0])):
        assert not view.is_contiguous()
        with pytest.raises(
            ops.OpError,
            match=r"^set_data_ipc: `tmp_input` is not contiguous \(a strided view, shape \[.*\]\)",
        ):
            ops.set_data_ipc(view, name)
        assert not (SHM / name).exists()
    arr = np.arange(16, dtype=np.float32)
    with pytest.raises(
        ValueError,
        match=r"^set_data_ipc: `tmp_input` is not contiguous \(a strided view, shape \[8\]\)",
    ):
        _kernels.set_data_ipc(arr[::2], name)
    assert not (SHM / name).exists()
    np.testing.assert_array_equal(big.numpy(), np.arange(16, dtype=np.float32))


def test_set_data_ipc_refuses_a_null_data_pointer(name):
    with pytest.raises(
        ValueError, match=r"^set_data_ipc: `tmp_input` has 4 element\(s\) but a null data pointer"
    ):
        _kernels.set_data_ipc((0, "float32", (4,), "cpu"), name)
    assert not (SHM / name).exists()


def assert_attach_refused(cache: str, reason: str) -> None:
    """Attaching segment `cache` through the Paddle op fails: the message names the op and
    the segment, then `reason` (a regular expression)."""
    with pytest.raises(
        ops.OpError, match=rf"^share_external_data: shared-memory segment `{cache}` {reason}"
    ):
        ops.share_external_data(placeholder("float32"), cache, [16])


@pytest.mark.parametrize("mode", [0o666, 0o660, 0o606, 0o640, 0o604, 0o700 | 0o001])
def test_attach_refuses_a_segment_with_group_or_other_permission_bits(name, mode):
    """A local user who pre-creates a cache name with mode 0666 would receive every write;
    attaching refuses any segment with group/other permission bits (owner checks: see the
    next test)."""
    cache = f"{name}key_caches_0_rank0.device0"
    forge(cache, mode=mode)
    assert_attach_refused(
        cache,
        rf"has mode 0{mode:03o}: other users may read or write it \(set_data_ipc creates segments "
        r"with mode 0600\); refusing to attach it",
    )
    with pytest.raises(ValueError, match=rf"has mode 0{mode:03o}"):
        _kernels.share_external_data(np.empty((), np.float32), cache, [16])
    os.chmod(SHM / cache, 0o600)  # the same bytes, private: attached
    a = ops.share_external_data(placeholder("float32"), cache, [16])
    np.testing.assert_array_equal(a.numpy(), np.arange(16, dtype=np.float32))
    ops.unset_data_ipc(a, cache, True, True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file another owner")
def test_attach_and_replace_refuse_a_segment_owned_by_another_uid(name):
    """No second user exists here; as root the test chowns a forged segment to another uid
    (root could attach it, and is refused all the same)."""
    forge(name)
    os.chown(SHM / name, os.geteuid() + 4242, -1)
    assert_attach_refused(
        name,
        rf"is owned by uid {os.geteuid() + 4242}, not by this process's uid {os.geteuid()}; "
        r"refusing to attach a segment another user created",
    )
    t = paddle.ones([4])
    with pytest.raises(
        ops.OpError,
        match=rf"^set_data_ipc: a shared-memory segment `{name}` already exists and is owned by "
        r"uid \d+, not by this process's uid \d+; refusing to replace another user's segment",
    ):
        ops.set_data_ipc(t, name)
    assert (SHM / name).stat().st_uid == os.geteuid() + 4242  # left alone
    np.testing.assert_array_equal(t.numpy(), np.ones(4, np.float32))
    (SHM / name).unlink()


def test_set_data_ipc_replaces_a_planted_world_writable_segment_with_a_private_one(name):
    """The creator never writes into a segment someone else could have opened: a stale or
    planted segment of its own uid is unlinked and a fresh one created exclusively, 0600."""
    planted = forge(name, mode=0o666)
    spy = os.open(planted, os.O_RDWR)  # whoever planted it keeps a descriptor
    try:
        t = paddle.full([16], 5.0)
        ops.set_data_ipc(t, name)
        st = (SHM / name).stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_ino != os.fstat(spy).st_ino
        t.add_(paddle.ones([16]))
        seen = np.frombuffer(os.pread(spy, 64, 4096), np.float32)
        np.testing.assert_array_equal(seen, np.arange(16, dtype=np.float32))  # none of the writes
        a = ops.share_external_data(placeholder("float32"), name, [16])
        np.testing.assert_array_equal(a.numpy(), np.full(16, 6.0, np.float32))
    finally:
        os.close(spy)
    ops.unset_data_ipc(t, name, False, True)


@pytest.mark.parametrize(
    ("fields", "size", "message"),
    [
        # data_offset + data_bytes wraps: the tensor would start 4 KiB before the mapping
        (
            dict(data_offset=2**64 - 4096, data_bytes=8192),
            None,
            r"has an invalid data range \(offset 18446744073709547520, 8192 bytes\)",
        ),
        (
            dict(data_offset=0),
            None,
            r"places its data at offset 0; set_data_ipc writes it page aligned after the 128-byte "
            r"header",
        ),
        (dict(data_offset=64), None, r"places its data at offset 64"),
        (dict(data_offset=4100), None, r"places its data at offset 4100"),
        (
            dict(data_bytes=8192),
            None,
            r"is truncated \(4160 bytes for 8192 data bytes at offset 4096\)",
        ),
        (dict(data_bytes=2**62), None, r"has an invalid data range"),
        (dict(data_bytes=6), None, r"has an invalid data range \(offset 4096, 6 bytes\)"),
        (dict(version=2), None, r"has layout version 2; this build reads version 1"),
        (dict(kind=0), None, r"has an unknown kind 0"),
        (dict(kind=9), None, r"has an unknown kind 9"),
        (dict(dtype=-1), None, r"has an invalid dtype code -1"),
        (dict(dtype=3), None, r"has an invalid dtype code 3"),  # int32: not shareable
        (dict(dtype=99), None, r"has an invalid dtype code 99"),
        (dict(device_id=-1), None, r"has an invalid device id -1"),
        (dict(device_id=1), None, r"has an invalid device id 1"),  # host data: device 0
        (dict(kind=2, device_id=5000), None, r"has an invalid device id 5000"),
        (dict(creator_pid=0), None, r"has an invalid creator pid 0"),
        (dict(creator_pid=-7), None, r"has an invalid creator pid -7"),
        (dict(magic=0), None, r"is not a complete tensor segment"),
        ({}, 100, r"is not a complete tensor segment"),
        ({}, 40, r"holds 40 bytes: not a tensor segment written by set_data_ipc"),
    ],
)
def test_attach_validates_every_descriptor_field(name, fields, size, message):
    forge(name, size=size or 4096 + 64, **fields)
    with pytest.raises(ops.OpError, match=rf"^share_external_data: .*{message}"):
        ops.share_external_data(placeholder("float32"), name, [4])
    with pytest.raises(ValueError, match=rf"^share_external_data: .*{message}"):
        _kernels.share_external_data(np.empty((), np.float32), name, [4])
    ops.unset_data_ipc(placeholder("float32"), name, False, True)


def test_a_well_formed_forged_segment_attaches(name):
    """The control of the forgeries above: the same bytes with valid fields attach."""
    forge(name)
    a = ops.share_external_data(placeholder("float32"), name, [4, 4])
    np.testing.assert_array_equal(a.numpy().ravel(), np.arange(16, dtype=np.float32))
    ops.unset_data_ipc(a, name, True, True)


def test_attach_refuses_a_directory_or_fifo_in_place_of_a_segment(name):
    os.mkfifo(SHM / name, 0o600)
    with pytest.raises(
        ops.OpError, match=rf"shared-memory segment `{name}` is not a regular shared-memory file"
    ):
        ops.share_external_data(placeholder("float32"), name, [4])
    t = paddle.ones([4])
    ops.set_data_ipc(
        t, name
    )  # a stale non-segment of our own is replaced (without blocking on the FIFO)
    assert stat.S_ISREG((SHM / name).stat().st_mode)
    ops.unset_data_ipc(t, name, False, True)
